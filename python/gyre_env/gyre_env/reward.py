"""Reward servers: write a function that scores one item, then call serve_reward (or main).

Each item of a batch gets its own status: a score (OK), TIMEOUT when it ran past the request's
per-item budget, or ERROR with the exception's message. A failed item is never reported as a
reward of 0; what happens to it is the job's choice (reward.on_failure in Gyre's config). Scores
are cached by item id, so a retried request scores nothing twice.
"""
import argparse
import json
import threading
import time
from collections import OrderedDict
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import grpc

from . import env_pb2, env_pb2_grpc
from ._serve import run_server


@dataclass
class RewardItem:
    id: str
    prompt: str
    response: str
    task: Dict[str, Any]


# A score function returns the reward, or (reward, info) with a JSON-serialisable info dict.
ScoreFn = Callable[[RewardItem], Union[float, Tuple[float, Dict[str, Any]]]]


class _RewardServicer(env_pb2_grpc.RewardServicer):
    def __init__(self, fn: ScoreFn, name: str, max_concurrency: int, item_timeout_s: float,
                 cache_size: int = 100000):
        self._fn = fn
        self._name = name
        self._max_concurrency = max_concurrency
        self._item_timeout_s = item_timeout_s
        # Items run on their own pool: a request thread waits for its items with a deadline, and
        # an item that overruns it keeps its worker until it returns (Python cannot stop a
        # thread), so the pool is sized beyond the concurrency limit.
        self._pool = futures.ThreadPoolExecutor(max_workers=max(1, 4 * max_concurrency))
        self._cache: "OrderedDict[str, env_pb2.ItemScore]" = OrderedDict()
        self._cache_size = cache_size
        self._mu = threading.Lock()

    def Describe(self, request, context):
        return env_pb2.DescribeResponse(protocol=env_pb2.ENV_PROTOCOL_V1, name=self._name,
                                        max_concurrency=self._max_concurrency)

    def _score_one(self, item: env_pb2.RewardItem) -> env_pb2.ItemScore:
        try:
            task = json.loads(item.task_json) if item.task_json else {}
            out = self._fn(RewardItem(id=item.id, prompt=item.prompt, response=item.response,
                                      task=task))
            info = None
            if isinstance(out, tuple):
                out, info = out
            reward = float(out)
            if reward != reward:  # NaN is an error, not a score
                raise ValueError("the score function returned NaN")
            return env_pb2.ItemScore(id=item.id, status=env_pb2.SCORE_OK, reward=reward,
                                     info_json=json.dumps(info, ensure_ascii=False) if info else "")
        except Exception as e:
            return env_pb2.ItemScore(id=item.id, status=env_pb2.SCORE_ERROR,
                                     error=f"{type(e).__name__}: {e}")

    def Score(self, request, context):
        budget = request.item_timeout_s if request.item_timeout_s > 0 else self._item_timeout_s
        scores: List[env_pb2.ItemScore] = []
        pending = []
        for item in request.items:
            with self._mu:
                cached = self._cache.get(item.id) if item.id else None
            if cached is not None:
                scores.append(cached)
            else:
                pending.append((item, self._pool.submit(self._score_one, item), time.monotonic()))
        for item, fut, started in pending:
            left = None if budget <= 0 else max(0.0, started + budget - time.monotonic())
            try:
                s = fut.result(timeout=left)
            except futures.TimeoutError:
                fut.cancel()
                s = env_pb2.ItemScore(id=item.id, status=env_pb2.SCORE_TIMEOUT,
                                      error=f"not scored within {budget:g} s")
            if s.status == env_pb2.SCORE_OK and item.id:
                with self._mu:
                    self._cache[item.id] = s
                    while len(self._cache) > self._cache_size:
                        self._cache.popitem(last=False)
            scores.append(s)
        return env_pb2.ScoreResponse(scores=scores)


def serve_reward(fn: ScoreFn, port: int = 0, host: str = "127.0.0.1", max_concurrency: int = 16,
                 item_timeout_s: float = 30.0, name: Optional[str] = None) -> None:
    """Serves `fn` until killed; prints "gyre_env: serving NAME on HOST:PORT" once it listens."""
    reward_name = name or getattr(fn, "__name__", None) or "reward"
    servicer = _RewardServicer(fn, reward_name, max_concurrency, item_timeout_s)
    run_server(lambda server: env_pb2_grpc.add_RewardServicer_to_server(servicer, server),
               reward_name, host, port, max_concurrency)


def main(fn: ScoreFn, argv: Optional[List[str]] = None) -> None:
    """Command-line entry for a reward script: --host, --port, --max-concurrency,
    --item-timeout."""
    p = argparse.ArgumentParser(description=f"Serve the reward function "
                                f"{getattr(fn, '__name__', '')} to Gyre (gyre.v1.Reward)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    p.add_argument("--port", type=int, default=0, help="port; 0 picks a free one [0]")
    p.add_argument("--max-concurrency", type=int, default=16, help="requests at once [16]")
    p.add_argument("--item-timeout", type=float, default=30.0,
                   help="seconds per item unless the request says otherwise [30]")
    a = p.parse_args(argv)
    serve_reward(fn, port=a.port, host=a.host, max_concurrency=a.max_concurrency,
                 item_timeout_s=a.item_timeout)
