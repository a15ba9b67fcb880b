"""Vendor the part of RunPod's OpenAPI document that `plscale runpod` uses.

Reads RunPod's published OpenAPI 3.1 document (REST v2) and writes
tests/fixtures/runpod/openapi-v2-subset.json: only the operations in OPERATIONS (each path's
method objects as published, with the path's own parameters), every component they reference,
transitively (schemas, parameters, responses, headers), the security scheme, and an "x-source"
note naming the source. The result is a self-contained OpenAPI document: every "$ref" in it
resolves inside it. tests/helpers/fake_runpod.py validates requests and responses against it.

    python tests/helpers/vendor_runpod_openapi.py [SOURCE] [--commit SHA] [--date YYYY-MM-DD]

SOURCE defaults to ../shared/runpod/openapi-v2.json relative to the repository root.
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = ROOT.parent / "shared" / "runpod" / "openapi-v2.json"
OUTPUT = ROOT / "tests" / "fixtures" / "runpod" / "openapi-v2-subset.json"
SOURCE_COMMIT = "a900806"  # RunPod's docs repository, the commit the shared copy was taken at
SOURCE_DATE = "2026-08-20"

# path -> the methods of it that plscale's client may call
OPERATIONS: dict[str, list[str]] = {
    "/v2/catalog/gpus": ["get"],
    "/v2/pods": ["get", "post"],
    "/v2/pods/{id}": ["get", "delete"],
    "/v2/pods/{id}/action": ["post"],
    "/v2/clusters": ["get", "post"],
    "/v2/clusters/{id}": ["get", "delete"],
    "/v2/clusters/{id}/pods": ["get"],
    "/v2/account/ssh-keys": ["get", "put"],
}
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
KINDS = ("schemas", "parameters", "responses", "headers")


def refs(node) -> list[str]:
    """Every "$ref" string inside `node`, in document order."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                found.append(value)
            else:
                found.extend(refs(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(refs(item))
    return found


def subset(doc: dict, operations: dict[str, list[str]] = OPERATIONS) -> dict:
    """The self-contained sub-document of `doc` holding only `operations`."""
    paths: dict[str, dict] = {}
    for path, methods in operations.items():
        item = doc["paths"][path]
        kept = {k: v for k, v in item.items() if k not in METHODS}  # parameters, summary, ...
        for method in methods:
            kept[method] = item[method]
        paths[path] = kept

    components = doc.get("components", {})
    needed: dict[str, set[str]] = {kind: set() for kind in KINDS}
    todo = refs(paths)
    while todo:
        ref = todo.pop()
        parts = ref.split("/")
        if len(parts) != 4 or parts[:2] != ["#", "components"] or parts[2] not in KINDS:
            raise ValueError(f"unsupported $ref {ref!r}")
        kind, name = parts[2], parts[3]
        if name in needed[kind]:
            continue
        if name not in components.get(kind, {}):
            raise ValueError(f"$ref {ref!r} points at nothing in the source document")
        needed[kind].add(name)
        todo.extend(refs(components[kind][name]))

    out_components: dict[str, dict] = {}
    for kind, entries in components.items():  # source order, for an easy diff
        if kind == "securitySchemes":
            out_components[kind] = entries
        elif kind in needed and needed[kind]:
            out_components[kind] = {n: v for n, v in entries.items() if n in needed[kind]}

    tags_used = {t for item in paths.values() for m, op in item.items() if m in METHODS
                 for t in op.get("tags", [])}
    out = {key: doc[key] for key in ("openapi", "info", "servers", "security") if key in doc}
    if "tags" in doc:
        out["tags"] = [t for t in doc["tags"] if t.get("name") in tags_used]
    out["components"] = out_components
    out["paths"] = paths
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--commit", default=SOURCE_COMMIT, help="commit of RunPod's docs repository")
    parser.add_argument("--date", default=SOURCE_DATE, help="date of that commit")
    args = parser.parse_args(argv)

    raw = args.source.read_bytes()
    doc = json.loads(raw)
    out = subset(doc)
    out["x-source"] = {
        "document": f"openapi-v2.json ({doc.get('info', {}).get('title', 'RunPod REST API')} "
                    f"{doc.get('info', {}).get('version', '?')}), OpenAPI {doc.get('openapi', '?')}",
        "from": "RunPod's docs repository",
        "commit": args.commit,
        "date": args.date,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "operations": [f"{m.upper()} {p}" for p, ms in OPERATIONS.items() for m in ms],
        "regenerate": "python tests/helpers/vendor_runpod_openapi.py [path/to/openapi-v2.json]",
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    counts = ", ".join(f"{len(v)} {k}" for k, v in out["components"].items())
    print(f"wrote {args.output} ({len(out['x-source']['operations'])} operations; {counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
