#!/usr/bin/python3
"""The texts test_json_schema walked at random through each schema's grammar: every one must be
JSON that Python's jsonschema (Draft 2020-12, formats asserted as make_schema_cases.py asserts
them) finds valid against its schema. A text the grammar allowed and the validator refuses is a
soundness bug in the converter (or the matcher)."""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_schema_cases import validator  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--walks", required=True)
    args = ap.parse_args()
    with open(args.walks, "rb") as f:
        data = f.read()
    pos, bad, count = 0, [], collections.Counter()
    schemas = {}
    while pos < len(data):
        end = data.index(b"\n", pos)
        word, name, n = data[pos:end].split(b" ")
        assert word == b"walk"
        name, n = name.decode(), int(n)
        text = data[end + 1:end + 1 + n]
        pos = end + 1 + n + 1
        if name not in schemas:
            with open(os.path.join(HERE, "schemas", name + ".json"), encoding="utf-8") as f:
                schema = json.load(f)
            schemas[name] = validator(schema)
        count[name] += 1
        try:
            value = json.loads(text.decode("utf-8"))
        except ValueError as e:
            bad.append("%s: not JSON (%s): %r" % (name, e, text))
            continue
        errors = list(schemas[name].iter_errors(value))
        if errors:
            bad.append("%s: invalid (%s): %r" % (name, errors[0].message, text))
    names = sorted(n[:-5] for n in os.listdir(os.path.join(HERE, "schemas")) if n.endswith(".json"))
    missing = [n for n in names if not count[n]]
    for b in bad[:20]:
        print(b)
    print("%d walks over %d schemas, %d invalid, schemas without walks: %s" %
          (sum(count.values()), len(count), len(bad), missing or "none"))
    sys.exit(1 if bad or missing else 0)


if __name__ == "__main__":
    main()
