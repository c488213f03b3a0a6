"""Builds the gRPC stubs (gen_proto.py) before packaging, so that
``pip install python`` ships s3dma/_proto. Metadata is in
pyproject.toml."""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithStubs(build_py):
    def run(self):
        sys.path.insert(0, str(HERE))
        import gen_proto

        if (gen_proto.DEFAULT_PROTO_ROOT / gen_proto.PROTOS[0]).exists():
            if not gen_proto.up_to_date():
                gen_proto.generate()
        elif not gen_proto.up_to_date():
            raise SystemExit(
                f"s3dma: the protos are not under {gen_proto.DEFAULT_PROTO_ROOT} and no stubs were generated"
            )
        # Packages found before the stubs existed: look again.
        from setuptools import find_packages

        self.packages = sorted(set(self.packages or []) | set(find_packages(str(HERE), include=["s3dma*"])))
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
