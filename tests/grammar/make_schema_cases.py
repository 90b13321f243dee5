#!/usr/bin/python3
"""Cases for test_json_schema: each schema of tests/grammar/schemas with candidate JSON texts and
Python's jsonschema verdict on each (Draft 2020-12, or the draft a schema's $schema names;
formats asserted), and the schemas the
converter must refuse with the status and a word its message must hold.

Candidates: the hand-written instances of schema_instances.json, instances generated from the
schema (regexes through Python's own sre_parse), mutations of those (a value of another type, a
member dropped, added or duplicated with a wrong value, lengths and numbers off by one) and random
JSON values. Each is written compact, with json.dumps' spaces and, when shallow enough, indented;
objects are put in the schema's order first (listed properties, required ones it does not list,
then the rest), since that is the order the grammar promises to accept.

A text is "required" (the grammar must accept it) when it is valid and within what the grammar
documents it writes (docs/grammars.md): integer parts of at most 15 digits, fractions of at most
20, exponents of at most 3 digits and none under integer bounds of a number, strings under a
pattern in printable ASCII matched by the pattern read as ECMA 262 reads it, time fractions of at
most 9 digits. Every valid text may be accepted; every invalid one must be refused.

Output (binary-safe, lengths in bytes):
  schema NAME LEN\\n<schema>\\n
  text VALID REQUIRED LEN\\n<text>\\n        (VALID: 1 valid, 0 not)
  refuse STATUS NEEDLE_LEN LEN\\n<needle><schema>\\n   (STATUS: unsupported | invalid)
  end\\n
"""
import argparse
import copy
import datetime
import json
import math
import os
import random
import re
import sys
import uuid

try:
    import re._parser as sre_parse  # Python 3.11
except ImportError:  # pragma: no cover
    import sre_parse

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
INT_DIGITS, FRAC_DIGITS, EXP_DIGITS, SPACE_MAX = 15, 20, 3, 20


# ---- formats jsonschema cannot check without extra packages: RFC 3339, written independently

TIME_RE = re.compile(r"(\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-](\d\d):(\d\d))", re.ASCII)


def rfc3339_time(s):
    m = TIME_RE.fullmatch(s)
    if not m:
        return False
    h, mi, se = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if h > 23 or mi > 59 or se > 60:
        return False
    if m.group(6) is not None and (int(m.group(6)) > 23 or int(m.group(7)) > 59):
        return False
    return True


def rfc3339_date(s):
    if not re.fullmatch(r"\d{4}-\d\d-\d\d", s, re.ASCII):
        return False
    try:
        datetime.date(int(s[:4]), int(s[5:7]), int(s[8:10]))
    except ValueError:
        return False
    return True


def rfc3339_datetime(s):
    if len(s) < 11 or s[10] not in "Tt":
        return False
    return rfc3339_date(s[:10]) and rfc3339_time(s[11:])


FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("time")
def _time(s):
    return not isinstance(s, str) or rfc3339_time(s)


@FORMATS.checks("date-time")
def _datetime(s):
    return not isinstance(s, str) or rfc3339_datetime(s)


def validator_class(schema):
    """The draft the schema names with $schema (draft-07's tuples differ), else 2020-12."""
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def validator(schema):
    return validator_class(schema)(schema, format_checker=FORMATS)


def as_2020(schema):
    """A draft-07 schema with its tuples (items: [..], additionalItems) written in 2020-12's words
    (prefixItems, items) and without its $schema, for the generator, which reads 2020-12; the
    cases made from it are checked against draft-07's own verdict on the original."""
    def walk(s):
        if not isinstance(s, dict):
            return s
        s = dict(s)
        if isinstance(s.get("items"), list):
            s["prefixItems"] = s.pop("items")
            if "additionalItems" in s:
                s["items"] = s.pop("additionalItems")
        s.pop("additionalItems", None)
        for k in ("properties", "$defs", "definitions"):
            if isinstance(s.get(k), dict):
                s[k] = {n: walk(v) for n, v in s[k].items()}
        for k in ("prefixItems", "anyOf", "oneOf", "allOf"):
            if isinstance(s.get(k), list):
                s[k] = [walk(v) for v in s[k]]
        for k in ("items", "additionalProperties"):
            if k in s:
                s[k] = walk(s[k])
        return s
    if validator_class(schema) is jsonschema.Draft202012Validator:
        return schema
    view = walk(schema)
    view.pop("$schema", None)
    return view


# ---- schema views (the order of members the converter writes)

def pointer(root, ref):
    assert ref.startswith("#")
    node = root
    frag = ref[1:]
    from urllib.parse import unquote
    frag = unquote(frag)
    if not frag:
        return node
    for seg in frag.split("/")[1:]:
        seg = seg.replace("~1", "/").replace("~0", "~")
        node = node[int(seg)] if isinstance(node, list) else node[seg]
    return node


ANNOT = {"title", "description", "default", "examples", "$schema", "$comment", "deprecated", "readOnly",
         "writeOnly", "$defs", "definitions", "discriminator", "$id"}


def flat(s, root, depth=0):
    """s with $ref and allOf merged in, as the converter merges them (order: own, $ref, allOf)."""
    if not isinstance(s, dict) or depth > 30 or ("$ref" not in s and "allOf" not in s):
        return s
    parts = [{k: v for k, v in s.items() if k not in ("$ref", "allOf")}]
    if "$ref" in s:
        parts.append(flat(pointer(root, s["$ref"]), root, depth + 1))
    for m in s.get("allOf", []):
        parts.append(flat(m, root, depth + 1))
    out = {}
    for p in parts:
        if p is True:
            continue
        for k, v in p.items():
            if k in ANNOT:
                continue
            if k == "properties":
                props = out.setdefault("properties", {})
                for name, ps in v.items():
                    props[name] = {"allOf": [props[name], ps]} if name in props and props[name] != ps else ps
            elif k == "required":
                req = out.setdefault("required", [])
                req.extend(r for r in v if r not in req)
            else:
                out.setdefault(k, v)
    return out


def branches(s, root):
    """anyOf/oneOf members with the keywords beside them merged in."""
    key = "anyOf" if "anyOf" in s else "oneOf"
    sib = {k: v for k, v in s.items() if k != key and k not in ANNOT}
    out = []
    for b in s[key]:
        if b is False:
            continue
        out.append(flat({"allOf": [sib, b]}, root) if sib else b)
    return out


def is_valid(s, root, x):
    return validator(root).evolve(schema=s).is_valid(x)


class Dup:
    """An object with a duplicated key (a list of pairs), which a dict cannot hold."""

    def __init__(self, pairs):
        self.pairs = pairs


def canon(v, s, root, depth=0):
    """v with its objects' members in the order the grammar writes them under schema s."""
    if depth > 60 or s is True or s is False or not isinstance(s, dict):
        return v
    s = flat(s, root)
    if "enum" in s or "const" in s:
        for c in s.get("enum", []) + ([s["const"]] if "const" in s else []):
            if c == v and type(c) == type(v):
                return copy.deepcopy(c)
        return v
    if "anyOf" in s or "oneOf" in s:
        for b in branches(s, root):
            if is_valid(b, root, v):
                return canon(v, b, root, depth + 1)
        return v
    if isinstance(v, dict):
        props = s.get("properties", {})
        order = list(props) + [r for r in s.get("required", []) if r not in props]
        out = {}
        for k in order:
            if k in v:
                out[k] = canon(v[k], props.get(k, s.get("additionalProperties", True)), root, depth + 1)
        for k in v:
            if k not in out:
                out[k] = canon(v[k], s.get("additionalProperties", True), root, depth + 1)
        return out
    if isinstance(v, list):
        prefix = s.get("prefixItems", [])
        return [canon(x, prefix[i] if i < len(prefix) else s.get("items", True), root, depth + 1)
                for i, x in enumerate(v)]
    return v


def number_ok(x):
    if isinstance(x, bool):
        return True
    if isinstance(x, int):
        return abs(x) <= 10 ** INT_DIGITS - 1
    r = json.dumps(x)
    m = re.fullmatch(r"-?(\d+)(?:\.(\d+))?(?:[eE][-+]?(\d+))?", r)
    return bool(m) and len(m.group(1)) <= INT_DIGITS and len(m.group(2) or "") <= FRAC_DIGITS and \
        len(m.group(3) or "") <= EXP_DIGITS


def ecma_ok(pattern, s):
    """s matched by pattern the way both ECMA 262 and Python's re match it: '$' only at the end,
    \\d \\w \\s as ASCII, and printable ASCII text where the two differ outside ASCII (\\D \\W \\S,
    '.', negated classes)."""
    if re.search(r"\\[DWS]|(?<!\\)\.|(?<!\\)\[\^", pattern) and not all(0x20 <= ord(c) < 0x7F for c in s):
        return False
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append("\\Z" if c == "$" and not in_class else c)
        i += 1
    return re.search("".join(out), s, re.ASCII) is not None


def within(v, s, root, depth=0):
    """v within what the grammar writes under s (the digit bounds, patterns as ECMA reads them)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and not number_ok(v):
        return False
    if depth > 60 or not isinstance(s, dict):
        return all_numbers_ok(v)
    s = flat(s, root)
    if "enum" in s or "const" in s:
        return all_numbers_ok(v)
    if "anyOf" in s or "oneOf" in s:
        return any(is_valid(b, root, v) and within(v, b, root, depth + 1) for b in branches(s, root))
    if isinstance(v, dict):
        props = s.get("properties", {})
        return all(within(x, props.get(k, s.get("additionalProperties", True)), root, depth + 1) for k, x in v.items())
    if isinstance(v, list):
        prefix = s.get("prefixItems", [])
        return all(within(x, prefix[i] if i < len(prefix) else s.get("items", True), root, depth + 1)
                   for i, x in enumerate(v))
    if isinstance(v, str):
        if "pattern" in s and not ecma_ok(s["pattern"], v):
            return False
        if s.get("format") in ("time", "date-time"):
            m = re.search(r"\.(\d+)", v)
            return not m or len(m.group(1)) <= 9
        return True
    types = s.get("type")
    types = [types] if isinstance(types, str) else types
    if isinstance(v, float) and types and "integer" in types and "number" not in types:
        return False  # an integer written with a fraction (1.0) is an integer to jsonschema, not to the grammar
    if isinstance(v, float) and types == ["number"] and \
            any(k in s for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "e" not in json.dumps(v)
    return True


def all_numbers_ok(v):
    if isinstance(v, dict):
        return all(all_numbers_ok(x) for x in v.values())
    if isinstance(v, list):
        return all(all_numbers_ok(x) for x in v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return number_ok(v)
    return True


# ---- serializing

def dumps(v, style, depth=0):
    item_sep, key_sep = (",", ":") if style == "compact" else (", ", ": ")
    ind = style == "indent"

    def nl(d):
        return "\n" + "  " * d if ind else ""

    if isinstance(v, Dup):
        pairs = v.pairs
    elif isinstance(v, dict):
        pairs = list(v.items())
    elif isinstance(v, list):
        if not v:
            return "[]"
        sep = "," if ind else item_sep
        return "[" + sep.join(nl(depth + 1) + dumps(x, style, depth + 1) for x in v) + nl(depth) + "]"
    else:
        return json.dumps(v, ensure_ascii=False)
    if not pairs:
        return "{}"
    sep = "," if ind else item_sep
    return "{" + sep.join(nl(depth + 1) + json.dumps(k, ensure_ascii=False) + key_sep + dumps(x, style, depth + 1)
                          for k, x in pairs) + nl(depth) + "}"


def nesting(v):
    if isinstance(v, Dup):
        return 1 + max([nesting(x) for _, x in v.pairs] or [0])
    if isinstance(v, dict):
        return 1 + max([nesting(x) for x in v.values()] or [0])
    if isinstance(v, list):
        return 1 + max([nesting(x) for x in v] or [0])
    return 0


# ---- generating instances

ALPHABET = list("abcxyzAZ09 _-.:/@") + ["é", "ü", "ß", "中", "😀", "\"", "\\", "\n", "\t", "\u0001", "\u2028"]


def rand_string(rng, lo=0, hi=None):
    hi = lo + rng.randint(0, 6) if hi is None else min(hi, lo + rng.randint(0, 6))
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, max(lo, hi))))


def rand_json(rng, depth=0):
    k = rng.randint(0, 7 if depth < 3 else 5)
    if k == 0:
        return None
    if k == 1:
        return rng.random() < 0.5
    if k == 2:
        return rng.randint(-1000, 1000)
    if k == 3:
        return round(rng.uniform(-1000, 1000), rng.randint(0, 4))
    if k in (4, 5):
        return rand_string(rng)
    if k == 6:
        return [rand_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rand_string(rng, 1, 4): rand_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def gen_regex(rng, items, depth=0):
    """A string matching the sre_parse tree items (bounded repetitions)."""
    out = []
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "ANY":
            out.append(rng.choice("aZ5 -"))
        elif name == "IN":
            out.append(gen_class(rng, av))
        elif name in ("MAX_REPEAT", "MIN_REPEAT"):
            lo, hi, sub = av
            hi = min(hi, lo + 3) if str(hi) != "MAXREPEAT" else lo + 3
            for _ in range(rng.randint(lo, max(lo, hi))):
                out.append(gen_regex(rng, sub, depth + 1))
        elif name == "SUBPATTERN":
            out.append(gen_regex(rng, av[-1], depth + 1))
        elif name == "BRANCH":
            out.append(gen_regex(rng, rng.choice(av[1]), depth + 1))
        elif name == "AT":
            pass
        elif name == "CATEGORY":
            out.append(gen_category(rng, str(av)))
        else:
            raise ValueError(name)
    return "".join(out)


def gen_category(rng, cat):
    table = {"CATEGORY_DIGIT": "0123456789", "CATEGORY_WORD": "abzAZ09_", "CATEGORY_SPACE": " \t",
             "CATEGORY_NOT_DIGIT": "ab-_ ", "CATEGORY_NOT_WORD": " -.!", "CATEGORY_NOT_SPACE": "ab1-"}
    return rng.choice(table[cat])


def gen_class(rng, av):
    if str(av[0][0]) == "NEGATE":
        excluded = av[1:]
        for _ in range(50):
            c = rng.choice("abcdxyzABC019 -_.!\"\\é")
            if re.fullmatch("[^" + "".join(class_text(a) for a in excluded) + "]", c):
                return c
        return "~"
    op, a = rng.choice(av)
    name = str(op)
    if name == "LITERAL":
        return chr(a)
    if name == "RANGE":
        return chr(rng.randint(a[0], a[1]))
    if name == "CATEGORY":
        return gen_category(rng, str(a))
    raise ValueError(name)


def class_text(item):
    op, a = item
    name = str(op)
    if name == "LITERAL":
        return re.escape(chr(a))
    if name == "RANGE":
        return re.escape(chr(a[0])) + "-" + re.escape(chr(a[1]))
    return {"CATEGORY_DIGIT": "\\d", "CATEGORY_WORD": "\\w", "CATEGORY_SPACE": "\\s", "CATEGORY_NOT_DIGIT": "\\D",
            "CATEGORY_NOT_WORD": "\\W", "CATEGORY_NOT_SPACE": "\\S"}[str(a)]


def gen_format(rng, fmt):
    if fmt == "date":
        return "%04d-%02d-%02d" % (rng.randint(1, 9999), rng.randint(1, 12), rng.randint(1, 31))
    if fmt == "time":
        frac = "." + str(rng.randint(0, 999)) if rng.random() < 0.3 else ""
        off = rng.choice(["Z", "+01:00", "-05:30", "+23:59"])
        return "%02d:%02d:%02d%s%s" % (rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59), frac, off)
    if fmt == "date-time":
        return gen_format(rng, "date") + "T" + gen_format(rng, "time")
    if fmt == "uuid":
        u = str(uuid.UUID(int=rng.getrandbits(128)))
        return u.upper() if rng.random() < 0.3 else u
    if fmt == "ipv4":
        return ".".join(str(rng.randint(0, 255)) for _ in range(4))
    return rand_string(rng)


def bounds_of(s):
    lo = hi = None
    lo_ex = hi_ex = False
    if "minimum" in s:
        lo = s["minimum"]
    if "exclusiveMinimum" in s and (lo is None or s["exclusiveMinimum"] >= lo):
        lo, lo_ex = s["exclusiveMinimum"], True
    if "maximum" in s:
        hi = s["maximum"]
    if "exclusiveMaximum" in s and (hi is None or s["exclusiveMaximum"] <= hi):
        hi, hi_ex = s["exclusiveMaximum"], True
    return lo, lo_ex, hi, hi_ex


def gen(rng, s, root, depth=0):
    """A value for s, valid more often than not."""
    if s is True or depth > 8:
        return rand_json(rng, 3)
    if s is False:
        return None
    s = flat(s, root)
    if "const" in s:
        return copy.deepcopy(s["const"])
    if "enum" in s:
        return copy.deepcopy(rng.choice(s["enum"]))
    if "anyOf" in s or "oneOf" in s:
        return gen(rng, rng.choice(branches(s, root)), root, depth + 1)
    types = s.get("type", ["null", "boolean", "object", "array", "number", "integer", "string"])
    types = [types] if isinstance(types, str) else types
    t = rng.choice(types)
    if t == "null":
        return None
    if t == "boolean":
        return rng.random() < 0.5
    if t in ("integer", "number"):
        lo, lo_ex, hi, hi_ex = bounds_of(s)
        a = -10 ** 6 if lo is None else lo
        b = (a + 10 ** 6) if hi is None else hi
        if lo is None and hi is not None:
            a = b - 10 ** 6
        ia, ib = math.ceil(a), math.floor(b)
        if t == "integer" or rng.random() < 0.3:
            if rng.random() < 0.2 or ia > ib:
                return rng.choice([ia - 1, ib + 1, ia, ib])
            return rng.randint(ia, ib)
        return round(rng.uniform(a, b), rng.randint(1, 5))
    if t == "string":
        if "pattern" in s:
            tree = sre_parse.parse(s["pattern"])
            core = gen_regex(rng, list(tree))
            if not s["pattern"].startswith("^"):
                core = rand_string(rng, 0, 2) + core
            if not s["pattern"].endswith("$"):
                core = core + rand_string(rng, 0, 2)
            return core
        if "format" in s:
            return gen_format(rng, s["format"])
        return rand_string(rng, s.get("minLength", 0), s.get("maxLength"))
    if t == "array":
        prefix = s.get("prefixItems", [])
        lo = s.get("minItems", 0)
        hi = s.get("maxItems", lo + 3)
        if s.get("items") is False:
            hi = min(hi, len(prefix))
        n = rng.randint(lo, max(lo, min(hi, lo + 3)))
        return [gen(rng, prefix[i] if i < len(prefix) else s.get("items", True), root, depth + 1) for i in range(n)]
    props = s.get("properties", {})
    req = s.get("required", [])
    out = {}
    for k, ps in props.items():
        if ps is not False and (k in req or rng.random() < 0.6):
            out[k] = gen(rng, ps, root, depth + 1)
    addl = s.get("additionalProperties", True)
    for r in req:
        if r not in out:
            out[r] = gen(rng, addl, root, depth + 1)
    if addl is not False and rng.random() < 0.3:
        out[rng.choice(["extra", "zz", "é", "a\"q", ""])] = gen(rng, addl, root, depth + 1)
    return out


def mutate(rng, v, s, root):
    """v changed in one place."""
    v = copy.deepcopy(v)
    paths = []

    def walk(x, path):
        paths.append(path)
        if isinstance(x, dict):
            for k in x:
                walk(x[k], path + [k])
        elif isinstance(x, list):
            for i, y in enumerate(x):
                walk(y, path + [i])

    walk(v, [])
    path = rng.choice(paths)
    parent = None
    node = v
    for p in path:
        parent, node = node, node[p]
    kind = rng.randint(0, 6)
    if kind == 0 or not path:
        new = rand_json(rng, 2)
    elif isinstance(node, str):
        new = node + rng.choice(["x", "😀", "\"", "0", "-"]) if rng.random() < 0.5 else node[:-1]
    elif isinstance(node, bool) or node is None:
        new = rng.choice([0, "true", None, False, True, []])
    elif isinstance(node, (int, float)):
        new = rng.choice([node + 1, node - 1, -node, node * 10, node + 0.5, str(node)])
    elif isinstance(node, list):
        new = node + [rand_json(rng, 2)] if rng.random() < 0.5 or not node else node[:-1]
    else:
        choice = rng.random()
        keys = list(node)
        if choice < 0.3 and keys:
            new = {k: x for k, x in node.items() if k != rng.choice(keys)}
        elif choice < 0.6 and keys:
            # a duplicate of a listed key with another value: Python keeps the last one
            k = rng.choice(keys)
            new = Dup(list(node.items()) + [(k, rand_json(rng, 2))])
        else:
            new = dict(node)
            new[rng.choice(["extra", "zz", "secret", "a"])] = rand_json(rng, 2)
    if not path:
        return new
    parent[path[-1]] = new
    return v


def has_dup(v):
    if isinstance(v, Dup):
        return True
    if isinstance(v, dict):
        return any(has_dup(x) for x in v.values())
    if isinstance(v, list):
        return any(has_dup(x) for x in v)
    return False


def texts_for(rng, value, schema, root):
    """(text, valid, required) for value in each style."""
    out = []
    dup = has_dup(value)
    if not dup:
        value = canon(value, schema, root)
    styles = ["compact", "spaced"] + (["indent"] if nesting(value) * 2 <= SPACE_MAX else [])
    for style in styles:
        text = dumps(value, style)
        try:
            parsed = json.loads(text)
        except ValueError:
            continue
        valid = validator(root).is_valid(parsed)
        required = valid and not dup and within(parsed, schema, root)
        out.append((text, valid, required))
    return out


def raw_texts(texts, root):
    out = []
    for text in texts:
        try:
            valid = validator(root).is_valid(json.loads(text))
        except ValueError:
            valid = False
        out.append((text, valid, False))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--generated", type=int, default=40, help="generated instances per schema")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(os.path.join(HERE, "schema_instances.json"), encoding="utf-8") as f:
        hand = json.load(f)
    with open(os.path.join(HERE, "schema_refusals.json"), encoding="utf-8") as f:
        refusals = json.load(f)
    names = sorted(n[:-5] for n in os.listdir(os.path.join(HERE, "schemas")) if n.endswith(".json"))
    missing = set(hand) - set(names)
    if missing:
        sys.exit("schema_instances.json names schemas that do not exist: %s" % sorted(missing))
    out = bytearray()
    counts = [0, 0, 0]
    for name in names:
        with open(os.path.join(HERE, "schemas", name + ".json"), "rb") as f:
            raw = f.read()
        original = json.loads(raw)
        validator_class(original).check_schema(original)
        schema = as_2020(original)
        out += b"schema %s %d\n" % (name.encode(), len(raw)) + raw + b"\n"
        cases = []
        h = hand.get(name, {})
        for v in h.get("valid", []):
            t = texts_for(rng, v, schema, schema)
            bad = [x for x in t if not x[2]]
            if bad:
                sys.exit("%s: hand-written valid instance %r is not valid and within the grammar's bounds" % (name, bad[0][0]))
            cases += t
        for v in h.get("invalid", []):
            t = texts_for(rng, v, schema, schema)
            if any(x[1] for x in t):
                sys.exit("%s: hand-written invalid instance %r is valid" % (name, v))
            cases += t
        cases += raw_texts(h.get("texts", []), schema)
        for _ in range(args.generated):
            v = gen(rng, schema, schema)
            cases += texts_for(rng, v, schema, schema)
            cases += texts_for(rng, mutate(rng, v, schema, schema), schema, schema)
        for _ in range(3):
            cases += texts_for(rng, rand_json(rng), schema, schema)
        seen = set()
        for text, valid, required in cases:
            if text in seen:
                continue
            seen.add(text)
            if schema is not original and valid != validator(original).is_valid(json.loads(text)):
                sys.exit("%s: the 2020-12 view and draft-07 disagree on %s" % (name, text))
            b = text.encode()
            out += b"text %d %d %d\n" % (valid, required, len(b)) + b + b"\n"
            counts[0] += 1
            counts[1] += valid
            counts[2] += required
    for r in refusals:
        raw = r["schema"] if isinstance(r["schema"], str) else json.dumps(r["schema"], ensure_ascii=False)
        raw = raw.encode()
        needle = r["names"].encode()
        out += b"refuse %s %d %d\n" % (r["status"].encode(), len(needle), len(raw)) + needle + raw + b"\n"
    out += b"end\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(out)
    print("%d schemas, %d texts (%d valid, %d required), %d refusals" %
          (len(names), counts[0], counts[1], counts[2], len(refusals)))


if __name__ == "__main__":
    main()
