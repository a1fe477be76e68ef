"""Builds gyre_env, generating the gRPC stubs of proto/gyre/v1/env.proto into the package.

The protocol file lives in the Gyre repository (../../proto); install from a checkout:
    pip install ./python/gyre_env
"""
import os
import re

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "proto", "gyre", "v1"))


class BuildWithStubs(build_py):
    """build_py that also writes gyre_env/env_pb2.py and env_pb2_grpc.py."""

    def run(self):
        super().run()
        from grpc_tools import protoc  # a build requirement (pyproject.toml)

        proto = os.path.join(PROTO_DIR, "env.proto")
        if not os.path.isfile(proto):
            raise RuntimeError(f"gyre_env: {proto} not found; install from a Gyre checkout")
        out = os.path.join(self.build_lib, "gyre_env")
        os.makedirs(out, exist_ok=True)
        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{include}",
                          f"--python_out={out}", f"--grpc_python_out={out}", proto])
        if rc != 0:
            raise RuntimeError(f"gyre_env: protoc failed on {proto} (exit {rc})")
        # The generated service module imports its messages as a top-level module; make the
        # import package-relative so the stubs live inside gyre_env.
        grpc_file = os.path.join(out, "env_pb2_grpc.py")
        with open(grpc_file) as f:
            text = f.read()
        text = re.sub(r"^import env_pb2 as", "from . import env_pb2 as", text, flags=re.M)
        with open(grpc_file, "w") as f:
            f.write(text)


setup(cmdclass={"build_py": BuildWithStubs})
