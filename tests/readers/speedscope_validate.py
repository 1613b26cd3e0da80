#!/usr/bin/env python3
"""Validates a speedscope file against the JSON schema shipped in the
`speedscope` npm package (dist/release/file-format-schema.json), with the
`jsonschema` PyPI package. An independent reader for tests/tests/profile_formats.rs.

Usage: speedscope_validate.py SCHEMA FILE
Prints `valid` and exits 0, or prints the first error and exits 1.
"""
import json
import sys

import jsonschema

schema = json.load(open(sys.argv[1]))
doc = json.load(open(sys.argv[2]))
try:
    jsonschema.validate(doc, schema)
except jsonschema.ValidationError as e:
    print(f"invalid: {e.message} at {list(e.absolute_path)}")
    sys.exit(1)
print("valid")
