"""The part of serving that environments and reward servers share."""
from concurrent import futures
from typing import Callable

import grpc


def run_server(add_servicer: Callable[[grpc.Server], None], name: str, host: str, port: int,
               max_concurrency: int) -> None:
    """Starts a gRPC server with the servicer that `add_servicer` adds, prints
    "gyre_env: serving NAME on HOST:PORT" once it listens (port 0 picks a free one) and serves
    until the process is killed."""
    workers = max(1, max_concurrency)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         maximum_concurrent_rpcs=4 * workers)
    add_servicer(server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise SystemExit(f"gyre_env: cannot listen on {host}:{port}")
    server.start()
    print(f"gyre_env: serving {name} on {host}:{bound}", flush=True)
    server.wait_for_termination()
