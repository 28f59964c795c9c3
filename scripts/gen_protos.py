#!/usr/bin/env python3
"""Generate the `amc.v1` Python package (messages, gRPC stubs, .pyi) from protos/.

The output is never edited by hand and is not committed: `make protos` writes it into the
checkout, and building the wheel (setup.py) writes it into the build, so neither can be
stale against protos/.
"""

import pathlib
import shutil
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "protos"


def generate(out: pathlib.Path, src: pathlib.Path = SRC) -> list[str]:
    """Writes the `amc` package under `out` from the .proto files under `src`; returns them."""
    target = out / "amc"
    shutil.rmtree(target, ignore_errors=True)
    protos = sorted(str(p.relative_to(src)) for p in src.rglob("*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files under {src}")
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{src}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *protos,
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc}) on {', '.join(protos)}")
    marker = '"""Generated from protos/ by scripts/gen_protos.py."""\n'
    for package in [target, *[p for p in target.rglob("*") if p.is_dir()]]:
        (package / "__init__.py").write_text(marker)
    return protos


def main() -> int:
    protos = generate(ROOT)
    print(f"generated {len(protos)} protos into amc/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
