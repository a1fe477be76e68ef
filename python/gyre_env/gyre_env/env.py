"""Environment servers: subclass Env, then call serve_env (or main) with the class.

Gyre is the client (proto/gyre/v1/env.proto). The server keeps one Env instance per session,
makes a retried Step harmless (the answer to the last step index is stored and sent again),
drops sessions whose episode deadline has passed, and bounds the sessions it works on at once.
"""
import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import grpc

from . import env_pb2, env_pb2_grpc
from ._serve import run_server


@dataclass
class ToolCall:
    """A tool call Gyre parsed from the model's reply."""
    id: str
    name: str
    arguments: Dict[str, Any]


@dataclass
class Action:
    """The model's reply to the last observation."""
    text: str
    token_ids: List[int]
    tool_calls: List[ToolCall]
    # Set when the reply tried to call a tool but the call could not be parsed: show it to the
    # model so it can correct itself.
    tool_call_error: str = ""


@dataclass
class StepResult:
    """What a step returns: the next observation, the step's reward, whether the episode ends."""
    messages: List[Dict[str, str]] = field(default_factory=list)  # e.g. [{"role": "tool", ...}]
    token_ids: List[int] = field(default_factory=list)  # or raw token ids instead of messages
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Optional[Dict[str, Any]] = None


class Env:
    """One episode of an environment. Override reset and step; close is optional.

    `name` names the environment in Describe; `tools` holds JSON-Schema function definitions that
    Gyre passes to the model's chat template. The server makes a new instance per session (the
    class is called with no arguments), so instance attributes are per-episode state.
    """
    name = "env"
    tools: List[Dict[str, Any]] = []

    def reset(self, task: Dict[str, Any], seed: int) -> List[Dict[str, str]]:
        """Starts the episode: returns its opening chat messages."""
        raise NotImplementedError

    def step(self, action: Action) -> StepResult:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _observation(messages, token_ids) -> env_pb2.Observation:
    obs = env_pb2.Observation(token_ids=list(token_ids or []))
    for i, m in enumerate(messages or []):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"observation message {i} is not a dict with a 'role'")
        obs.messages.add(role=str(m["role"]), content=str(m.get("content", "")),
                         name=str(m.get("name", "")), tool_call_id=str(m.get("tool_call_id", "")))
    return obs


class _Session:
    def __init__(self, env: Env, task_json: str, seed: int, deadline: Optional[float]):
        self.env = env
        self.key = (task_json, seed)
        self.deadline = deadline
        self.lock = threading.Lock()
        self.reset_response: Optional[env_pb2.ResetResponse] = None
        self.last_index = -1
        self.last_response: Optional[env_pb2.StepResponse] = None
        self.done = False


class _EnvServicer(env_pb2_grpc.EnvServicer):
    def __init__(self, factory: Callable[[], Env], name: str, max_concurrency: int):
        self._factory = factory
        self._name = name
        self._max_concurrency = max_concurrency
        self._sessions: Dict[str, _Session] = {}
        self._mu = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._reap_expired, daemon=True).start()

    def Describe(self, request, context):
        return env_pb2.DescribeResponse(protocol=env_pb2.ENV_PROTOCOL_V1, name=self._name,
                                        max_concurrency=self._max_concurrency)

    def Reset(self, request, context):
        if not request.session_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Reset: session_id is empty")
        try:
            task = json.loads(request.task_json) if request.task_json else {}
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Reset: task_json is not JSON: {e}")
        with self._mu:
            s = self._sessions.get(request.session_id)
            if s is not None and s.key != (request.task_json, request.seed):
                context.abort(grpc.StatusCode.ALREADY_EXISTS,
                              f"Reset: session {request.session_id} exists with another task/seed")
            if s is None:
                deadline = (time.monotonic() + request.episode_timeout_s
                            if request.episode_timeout_s > 0 else None)
                s = _Session(self._factory(), request.task_json, request.seed, deadline)
                self._sessions[request.session_id] = s
        with s.lock:
            if s.reset_response is None:
                try:
                    messages = s.env.reset(task, request.seed)
                    s.reset_response = env_pb2.ResetResponse(
                        observation=_observation(messages, []),
                        tools_json=json.dumps(getattr(s.env, "tools", []) or [],
                                              ensure_ascii=False))
                except Exception as e:  # the user's code failed: report it, keep serving
                    self._drop(request.session_id)
                    context.abort(grpc.StatusCode.INTERNAL, f"Reset: {type(e).__name__}: {e}")
            return s.reset_response

    def Step(self, request, context):
        with self._mu:
            s = self._sessions.get(request.session_id)
        if s is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"Step: no session {request.session_id} (never reset, closed or expired)")
        with s.lock:
            if s.reset_response is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"Step: session {request.session_id} has not been reset")
            if request.step_index == s.last_index and s.last_response is not None:
                return s.last_response  # a retry of the step already applied
            if request.step_index != s.last_index + 1:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"Step: step_index {request.step_index} but the next step is "
                              f"{s.last_index + 1}")
            if s.done:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              "Step: the episode has already ended")
            calls = []
            for c in request.tool_calls:
                try:
                    args = json.loads(c.arguments_json) if c.arguments_json else {}
                except ValueError:
                    args = {}
                calls.append(ToolCall(id=c.id, name=c.name, arguments=args))
            action = Action(text=request.action_text, token_ids=list(request.action_token_ids),
                            tool_calls=calls, tool_call_error=request.tool_call_error)
            try:
                r = s.env.step(action)
                if not isinstance(r, StepResult):
                    raise TypeError(f"step returned {type(r).__name__}, not StepResult")
                resp = env_pb2.StepResponse(
                    observation=_observation(r.messages, r.token_ids), reward=float(r.reward),
                    terminated=bool(r.terminated), truncated=bool(r.truncated),
                    info_json=json.dumps(r.info, ensure_ascii=False) if r.info else "")
            except Exception as e:
                context.abort(grpc.StatusCode.INTERNAL, f"Step: {type(e).__name__}: {e}")
            s.last_index = request.step_index
            s.last_response = resp
            s.done = resp.terminated or resp.truncated
            return resp

    def Close(self, request, context):
        self._drop(request.session_id)
        return env_pb2.CloseResponse()

    def _drop(self, session_id):
        with self._mu:
            s = self._sessions.pop(session_id, None)
        if s is not None:
            try:
                s.env.close()
            except Exception as e:
                print(f"gyre_env: close of session {session_id} failed: {e}", file=sys.stderr)

    def _reap_expired(self):
        while not self._stop.wait(0.5):
            now = time.monotonic()
            with self._mu:
                expired = [k for k, s in self._sessions.items()
                           if s.deadline is not None and now > s.deadline]
            for k in expired:
                self._drop(k)


def serve_env(factory: Callable[[], Env], port: int = 0, host: str = "127.0.0.1",
              max_concurrency: int = 16, name: Optional[str] = None) -> None:
    """Serves `factory` (an Env subclass or any callable returning an Env) until killed.

    Prints "gyre_env: serving NAME on HOST:PORT" once it listens (port 0 picks a free one).
    """
    env_name = name or getattr(factory, "name", None) or "env"
    servicer = _EnvServicer(factory, env_name, max_concurrency)
    run_server(lambda server: env_pb2_grpc.add_EnvServicer_to_server(servicer, server), env_name,
               host, port, max_concurrency)


def main(factory: Callable[[], Env], argv: Optional[List[str]] = None) -> None:
    """Command-line entry for an environment script: --host, --port, --max-concurrency."""
    p = argparse.ArgumentParser(description=f"Serve the {getattr(factory, 'name', 'env')} "
                                "environment to Gyre (gyre.v1.Env over gRPC)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    p.add_argument("--port", type=int, default=0, help="port; 0 picks a free one [0]")
    p.add_argument("--max-concurrency", type=int, default=16,
                   help="sessions worked on at once [16]")
    a = p.parse_args(argv)
    serve_env(factory, port=a.port, host=a.host, max_concurrency=a.max_concurrency)
