#!/usr/bin/env python3
"""Cases for test_grammar: random GBNF grammars with the texts they accept, decided by other engines.

Regular grammars (literals, classes, `.`, alternatives, groups, * + ? {m,n}, rules referring to
later rules) are written twice from one random tree: as GBNF and as a Python regular expression.
Each candidate text (random, sampled from the tree, mutated, cut short; ASCII and 2-4 byte UTF-8)
gets `re.fullmatch` (is it a sentence of the grammar) and the `regex` module's partial fullmatch
(can it still become one: the matcher must accept it as a prefix). Two non-regular languages,
balanced parentheses and nested arrays, are decided by a hand-written counter and by `regex`'s
recursive patterns.

Output, one line each (texts and grammars in hex, so any byte survives):
  G <start rule> <gbnf hex>
  C <sentence 0|1> <prefix 0|1> <text hex>
"""
import argparse
import random
import re

import regex

# characters the grammars are made of: ASCII that GBNF or regexes treat specially, 2, 3 and
# 4-byte UTF-8 (the edges of each length too)
ALPHABET = ['a', 'b', 'c', 'x', '0', '9', ' ', '"', '\\', ']', '[', '-', '^', '.', '|', '\n', '\t', '*',
            '\u00e9', '\u07ff', '\u0800', '\u20ac', '\u4e2d', '\uffff', '\U00010000', '\U0001d11e',
            '\U0010ffff']


MAX_TEXT = 14


def gbnf_char(c, in_class):
    """c as GBNF writes it in a literal or a class: itself, or an escape."""
    special = {'"': '\\"', '\\': '\\\\', '\n': '\\n', '\t': '\\t', '\r': '\\r'}
    if in_class:
        special.update({']': '\\]', '[': '\\['})
    if c in special:
        return special[c]
    if in_class and c in '-^':
        return '\\x%02X' % ord(c)
    if ord(c) >= 0x80 and random.random() < 0.5:
        return '\\u%04X' % ord(c) if ord(c) <= 0xFFFF else '\\U%08X' % ord(c)
    if ord(c) < 0x20:
        return '\\x%02X' % ord(c)
    return c


def re_char(c):
    return '\\U%08X' % ord(c)


class Gen:
    def __init__(self, rng):
        self.rng = rng
        self.alpha = rng.sample(ALPHABET, rng.randint(3, 7))
        self.rules = []  # (name, gbnf, regex) of the rules after root, in order

    def char(self):
        return self.rng.choice(self.alpha)

    def node(self, depth, rule_index):
        """(gbnf, regex, nullable, sample function) of a random expression."""
        rng = self.rng
        kinds = ['lit', 'cls', 'any'] + (['alt', 'seq', 'rep', 'group'] if depth < 3 else [])
        if rule_index + 1 < len(self.rules) and depth < 3:
            kinds.append('ref')
        k = rng.choice(kinds)
        if k == 'lit':
            s = ''.join(self.char() for _ in range(rng.randint(0 if rng.random() < 0.1 else 1, 3)))
            return ('"' + ''.join(gbnf_char(c, False) for c in s) + '"', '(?:' + ''.join(re_char(c) for c in s) + ')',
                    s == '', lambda: s)
        if k == 'cls':
            neg = rng.random() < 0.3
            parts, members = [], []
            for _ in range(rng.randint(1, 3)):
                a, b = sorted((self.char(), self.char()), key=ord)
                if rng.random() < 0.5 or a == b:
                    parts.append((a, a))
                else:
                    parts.append((a, b))
            g = '[' + ('^' if neg else '') + ''.join(
                gbnf_char(a, True) + ('' if a == b else '-' + gbnf_char(b, True)) for a, b in parts) + ']'
            r = '[' + ('^' if neg else '') + ''.join(
                re_char(a) + ('' if a == b else '-' + re_char(b)) for a, b in parts) + ']'
            inside = [c for c in self.alpha if any(a <= c <= b for a, b in parts)]
            outside = [c for c in self.alpha + ['z'] if c not in inside]
            pool = outside if neg else inside
            return g, r, False, lambda: rng.choice(pool) if pool else ''
        if k == 'any':
            return '.', '[\\s\\S]', False, lambda: self.char()
        if k == 'ref':
            j = rng.randint(rule_index + 1, len(self.rules) - 1)
            name, _, rx, nullable, sample = self.rules[j]
            return name, '(?:' + rx + ')', nullable, sample
        if k == 'group':
            g, r, n, s = self.node(depth + 1, rule_index)
            return '(' + g + ')', r, n, s
        if k == 'seq':
            items = [self.node(depth + 1, rule_index) for _ in range(rng.randint(2, 3))]
            return (' '.join(i[0] for i in items), '(?:' + ''.join(i[1] for i in items) + ')',
                    all(i[2] for i in items), lambda: ''.join(i[3]() for i in items))
        if k == 'alt':
            items = [self.node(depth + 1, rule_index) for _ in range(rng.randint(2, 3))]
            if rng.random() < 0.15:  # an empty alternative
                items.append(('', '', True, lambda: ''))
            return ('(' + ' | '.join(i[0] for i in items) + ')', '(?:' + '|'.join(i[1] for i in items) + ')',
                    any(i[2] for i in items), lambda: rng.choice(items)[3]())
        # repetition; an unbounded one of something that can be empty is left recursion to GBNF
        g, r, n, s = self.node(depth + 1, rule_index)
        ops = [('?', 0, 1), ('{%d}', None, None), ('{%d,%d}', None, None)]
        if not n:
            ops += [('*', 0, None), ('+', 1, None), ('{%d,}', None, None)]
        op, lo, hi = rng.choice(ops)
        if op == '{%d}':
            lo = hi = rng.randint(0, 3)
            op = op % lo
        elif op == '{%d,%d}':
            lo = rng.randint(0, 2)
            hi = lo + rng.randint(0, 3)
            op = op % (lo, hi)
        elif op == '{%d,}':
            lo = rng.randint(0, 2)
            op = op % lo
        rop = op if op[0] != '{' else op.replace(' ', '')
        return ('(' + g + ')' + op, '(?:' + r + ')' + rop, n or lo == 0,
                lambda: ''.join(s() for _ in range(rng.randint(lo, hi if hi is not None else lo + 3))))

    def grammar(self):
        rng = self.rng
        n_rules = rng.randint(0, 3)
        # rules are made last first, so each refers only to rules after it (no recursion)
        self.rules = []
        made = []
        for i in reversed(range(n_rules)):
            self.rules = made
            g, r, n, s = self.node(0, -1)
            made.insert(0, ('rule-%d' % i, g, r, n, s))
        self.rules = made
        g, r, n, s = self.node(0, -1)
        start = 'root' if rng.random() < 0.8 else 'start'
        text = '# a random regular grammar\n%s ::= %s\n' % (start, g)
        for name, rg, _, _, _ in made:
            text += '%s ::= %s\n' % (name, rg)
        return start, text, r, s


def mutate(rng, s, alpha):
    s = list(s)
    for _ in range(rng.randint(1, 2)):
        op = rng.randint(0, 2)
        i = rng.randint(0, len(s))
        if op == 0:
            s.insert(i, rng.choice(alpha))
        elif s and op == 1:
            del s[min(i, len(s) - 1)]
        elif s:
            s[min(i, len(s) - 1)] = rng.choice(alpha)
    return ''.join(s)


def emit_case(out, text, full, prefix):
    out.write('C %d %d %s\n' % (full, prefix, text.encode('utf-8').hex()))


def regular_cases(rng, out, n_grammars):
    for _ in range(n_grammars):
        gen = Gen(rng)
        start, text, rx, sample = gen.grammar()
        pat, pat_partial = re.compile(rx), regex.compile(rx)
        out.write('G %s %s\n' % (start, text.encode('utf-8').hex()))
        texts = set()
        for _ in range(12):
            t = sample()
            texts.add(t)
            texts.add(mutate(rng, t, gen.alpha + ['z', '\u00e8']))
            if t:
                texts.add(t[:rng.randint(0, len(t) - 1)])
        for _ in range(8):
            texts.add(''.join(rng.choice(gen.alpha) for _ in range(rng.randint(0, 6))))
        # short texts: backtracking engines are exponential on nested repetitions of long ones
        for t in sorted({t[:MAX_TEXT] for t in texts}):
            full = pat.fullmatch(t) is not None
            prefix = pat_partial.fullmatch(t, partial=True) is not None
            assert prefix or not full
            emit_case(out, t, full, prefix)


def balanced(t):
    depth = 0
    for c in t:
        if c == '(':
            depth += 1
        elif c == ')':
            depth -= 1
            if depth < 0:
                return False, False
        elif c not in 'ab':
            return False, False
    return depth == 0, True


def random_nested(rng, depth=0):
    if depth > 3 or rng.random() < 0.3:
        return rng.choice('0123456789')
    return '[' + ','.join(random_nested(rng, depth + 1) for _ in range(rng.randint(0, 3))) + ']'


def nonregular_cases(rng, out, n):
    out.write('G root %s\n' % '# balanced parentheses\nroot ::= ("(" root ")" | [ab])*\n'.encode().hex())
    texts = set()
    for _ in range(n):
        t = ''.join(rng.choice('(()ab') for _ in range(rng.randint(0, 12)))
        texts.add(t)
        # a balanced one and its prefixes
        d, s = 0, ''
        for _ in range(rng.randint(0, 14)):
            if d and rng.random() < 0.45:
                s += ')'
                d -= 1
            else:
                s += rng.choice('((a')
                d += s[-1] == '('
        s += ')' * d
        texts.add(s)
        texts.add(s[:rng.randint(0, len(s))])
    for t in sorted(texts):
        full, prefix = balanced(t)
        emit_case(out, t, full, prefix)

    out.write('G root %s\n' % (
        '# nested arrays of digits, recursive\n'
        'root ::= arr\n'
        'arr ::= "[" ( val ( "," val )* )? "]"\n'
        'val ::= arr | [0-9]\n').encode().hex())
    rec = regex.compile(r'(\[(?:(?:(?1)|[0-9])(?:,(?:(?1)|[0-9]))*)?\])')
    texts = set()
    for _ in range(n):
        s = random_nested(rng)
        texts.add(s)
        texts.add(s[:rng.randint(0, len(s))])
        texts.add(mutate(rng, s, '[],0'))
    for t in sorted(texts):
        full = rec.fullmatch(t) is not None
        prefix = rec.fullmatch(t, partial=True) is not None
        emit_case(out, t, full, prefix)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', required=True)
    ap.add_argument('--seed', type=int, default=29)
    ap.add_argument('--grammars', type=int, default=400)
    a = ap.parse_args()
    random.seed(a.seed)  # gbnf_char's choice of escapes
    rng = random.Random(a.seed)
    with open(a.out, 'w') as out:
        regular_cases(rng, out, a.grammars)
        nonregular_cases(rng, out, 300)


if __name__ == '__main__':
    main()
