#!/usr/bin/env python3
"""Generate the `amc.v1` Python package (messages, gRPC stubs, .pyi) from protos/.

The output is never edited by hand and is not committed; `make protos` reruns this.
"""

import pathlib
import shutil
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "protos"
OUT = ROOT


def main() -> int:
    target = OUT / "amc"
    shutil.rmtree(target, ignore_errors=True)
    protos = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.proto"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{SRC}",
            f"-I{include}",
            f"--python_out={OUT}",
            f"--pyi_out={OUT}",
            f"--grpc_python_out={OUT}",
            *protos,
        ]
    )
    if rc != 0:
        return rc
    for package in [target, *[p for p in target.rglob("*") if p.is_dir()]]:
        (package / "__init__.py").write_text('"""Generated from protos/ by make protos."""\n')
    print(f"generated {len(protos)} protos into {target.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
