"""The generated stubs (see gen_proto.py), with a clear error when missing."""

try:
    from ._proto.s3dma.agent.v1 import agent_pb2  # noqa: F401
    from ._proto.s3dma.tenant.v1 import tenant_pb2, tenant_pb2_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the checkout
    raise ImportError(
        "s3dma's gRPC stubs are missing or broken: run `python python/gen_proto.py` "
        f"(needs grpcio-tools), or install the package with pip ({e})"
    ) from e
