"""`InstalledAgent.run()`: the fixed per-task lifecycle of an installed scaffold.

start sandbox -> open a gateway session (capture) or pick the eval endpoint -> install the
scaffold -> run it under a wall-clock limit -> freeze the workspace -> run the verifier in
a clean sandbox -> parse the trajectory -> capture logs -> classify termination -> finish
the session with reward, status and reason -> tear down (always, also after a failure).

A failure in any stage is caught, named (`RunResult.failed_stage`) and classified
`infra_error`; sandboxes are stopped and an open session is finished as failed (or
deleted if finishing fails). This module owns the sequence; what to run is the
scaffold's, where to run it the sandbox's, and what is recorded the gateway's.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlgw.gateway.trajectories.client import FinishSummary, RolloutStoredError
from rlgw.sandboxes.base import Sandbox, SandboxFileNotFound
from rlgw.scaffolds.scaffold import InstalledScaffold, LLMEndpoint, Mode, ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.tasks import Task, parse_reward
from rlgw.scaffolds.termination import TerminationReason, status_for

log = logging.getLogger(__name__)

# Output kept on the result (the full logs go to `artifacts_dir` when one is set).
RESULT_OUTPUT_CHARS = 4000


class GatewaySessions(Protocol):
    """The part of `rlgw.gateway.trajectories.client.GatewayClient` the runner uses."""

    async def create_session(self, task_id: str, **kwargs: Any) -> Any: ...

    async def finish_session(self, session_id: str, **kwargs: Any) -> Any: ...

    async def delete_session(self, session_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Per-run settings. `engine_openai_url`: in eval, talk to the engine directly when it speaks OpenAI."""

    mode: Mode = "capture"
    model: str = "default"
    max_turns: int = 10
    agent_timeout_s: float = 1800.0
    install_timeout_s: float = 900.0
    engine_openai_url: str | None = None
    engine_api_key: str = "EMPTY"
    policy: str | None = None
    sampling: dict[str, Any] | None = None
    artifacts_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("capture", "eval"):
            raise ValueError(f"mode must be 'capture' or 'eval', not {self.mode!r}")
        if self.max_turns < 1 or self.agent_timeout_s <= 0 or self.install_timeout_s <= 0:
            raise ValueError("max_turns, agent_timeout_s and install_timeout_s must be positive")


@dataclass(slots=True)
class RunResult:
    """What one task run produced and how it ended."""

    task_id: str
    mode: Mode
    rollout_id: str
    reward: float | None = None
    termination: TerminationReason | None = None
    status: str | None = None
    exit_code: int | None = None
    turns: int = 0
    trainable_tokens: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)
    session_id: str | None = None
    failed_stage: str | None = None
    error: str | None = None
    detail: str = ""
    output_tail: str = ""
    duration_s: float = 0.0
    node: str | None = None  # the Ray node id that ran it (None when run in this process)
    # True when the rollout's finish was already stored (a retry after its worker died before
    # the answer came back): the result is the stored one and the agent did not run again.
    recovered: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (for Ray and for reports)."""
        doc = dataclasses.asdict(self)
        doc["termination"] = None if self.termination is None else str(self.termination)
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RunResult:
        """Inverse of `to_dict`."""
        doc = dict(doc)
        if doc.get("termination") is not None:
            doc["termination"] = TerminationReason(doc["termination"])
        return cls(**doc)


class _StageFailed(Exception):
    def __init__(self, stage: str, cause: BaseException):
        super().__init__(f"{stage}: {type(cause).__name__}: {cause}")
        self.stage = stage
        self.cause = cause


class InstalledAgent:
    """Runs one scaffold on tasks, one sandbox per run (plus a clean one for the verifier).

    `sandbox_factory` returns a new unstarted sandbox; `gateway` is a `GatewayClient` (needed
    for capture, and for eval unless `config.engine_openai_url` is set).
    """

    def __init__(
        self,
        scaffold: InstalledScaffold,
        sandbox_factory: Callable[[], Sandbox],
        gateway: GatewaySessions | None,
        config: AgentConfig,
    ):
        if gateway is None and (config.mode == "capture" or config.engine_openai_url is None):
            raise ValueError("a gateway client is needed for capture, and for eval without engine_openai_url")
        scaffold.check_mode(config.mode)  # a capture conflict fails before anything starts
        self.scaffold = scaffold
        self.sandbox_factory = sandbox_factory
        self.gateway = gateway
        self.config = config

    async def run(self, task: Task, *, rollout_id: str | None = None, group_index: int = 0) -> RunResult:
        """Run `task` once through the whole lifecycle; never raises for a failed stage."""
        cfg = self.config
        result = RunResult(task_id=task.id, mode=cfg.mode, rollout_id=rollout_id or uuid.uuid4().hex)
        started = time.monotonic()
        sandbox: Sandbox | None = None
        frozen = Path(tempfile.mkdtemp(prefix="rlgw-frozen-"))
        trajectory = TrajectoryInfo()
        timed_out = False
        logs: dict[str, bytes] = {}
        try:
            sandbox = self.sandbox_factory()
            await _stage("sandbox_start", sandbox.start())
            for path, content in task.setup_files.items():
                await _stage("setup", sandbox.write_file(path, content))
            endpoint = await _stage("session", self._endpoint(task, result, group_index))
            ctx = ScaffoldContext(
                task=task, mode=cfg.mode, llm=endpoint, workdir=sandbox.workdir,
                home=f"{sandbox.scratch}/{self.scaffold.name}", max_turns=cfg.max_turns,
                sampling=dict(cfg.sampling or {}),
            )  # fmt: skip
            await _stage("install", self._install(sandbox, ctx))
            run = await _stage(
                "run",
                sandbox.exec(
                    self.scaffold.run_command(ctx), timeout=cfg.agent_timeout_s, env=self.scaffold.env(ctx)
                ),
            )
            timed_out, result.exit_code = run.timed_out, run.exit_code
            result.output_tail = run.output[-RESULT_OUTPUT_CHARS:]
            await _stage("freeze", sandbox.download(sandbox.workdir, frozen / "workspace"))
            result.reward = await _stage("verify", self._verify(task, frozen / "workspace"))
            logs = await _stage("logs", self._collect_logs(sandbox, ctx))
            trajectory = self.scaffold.parse_trajectory(ctx, logs, run.output, run.exit_code)
            result.turns, result.detail = trajectory.turns, trajectory.detail
            self._save_artifacts(result, logs, run.output, frozen)
        except _StageFailed as e:
            if isinstance(e.cause, RolloutStoredError):
                # A retry of a run whose finish is stored (its worker died before the answer
                # came back): report the stored run; running it again would store it twice.
                _recover(result, e.cause.summary)
            else:
                result.failed_stage, result.error = e.stage, str(e)
                log.warning(
                    "task run failed",
                    extra={"fields": {"task": task.id, "stage": e.stage, "error": str(e),
                                      "tb": "".join(traceback.format_exception(e.cause))[-2000:]}},
                )  # fmt: skip
        if not result.recovered:
            result.termination = self.scaffold.termination_reason(
                infra_error=result.failed_stage is not None,
                timed_out=timed_out,
                exit_code=result.exit_code,
                trajectory=trajectory,
            )
            result.status = str(status_for(result.termination))
        try:
            if result.session_id is not None and not result.recovered:
                await self._finish(result)
        except RolloutStoredError as e:
            # Another live attempt of this rollout stored it first (this worker was thought dead and
            # the rollout retried): report that run; this session's samples are dropped, not stored twice.
            await self._delete_quietly(result.session_id)
            _recover(result, e.summary)
        except Exception as e:
            # The samples could not be stored: the run is lost for training, say so and clean up.
            result.failed_stage, result.error = "finish", f"finish: {type(e).__name__}: {e}"
            result.termination = TerminationReason.INFRA_ERROR
            result.status = str(status_for(result.termination))
            await self._delete_quietly(result.session_id)
        finally:
            if sandbox is not None:
                await _stop_quietly(sandbox)
            shutil.rmtree(frozen, ignore_errors=True)
        result.duration_s = time.monotonic() - started
        log.info(
            "task run done",
            extra={
                "fields": {
                    "task": task.id,
                    "reward": result.reward,
                    "termination": str(result.termination),
                    "turns": result.turns,
                    "trainable_tokens": result.trainable_tokens,
                    "duration_s": round(result.duration_s, 2),
                }
            },
        )
        return result

    async def _endpoint(self, task: Task, result: RunResult, group_index: int) -> LLMEndpoint:
        cfg = self.config
        if cfg.mode == "eval" and cfg.engine_openai_url:
            return LLMEndpoint(cfg.engine_openai_url, cfg.engine_api_key, cfg.model)
        assert self.gateway is not None  # checked in __init__
        info = await self.gateway.create_session(
            task.id,
            mode=cfg.mode,
            rollout_id=result.rollout_id,
            group_index=group_index,
            policy=cfg.policy,
            metadata={"scaffold": self.scaffold.name, **task.metadata},
            sampling=cfg.sampling,
        )
        result.session_id = info.session_id
        return LLMEndpoint(info.base_url, info.api_key, cfg.model)

    async def _install(self, sandbox: Sandbox, ctx: ScaffoldContext) -> None:
        for path, content in self.scaffold.install_files(ctx).items():
            await sandbox.write_file(path, content)
        for command in self.scaffold.install_commands(ctx):
            res = await sandbox.exec(command, timeout=self.config.install_timeout_s)
            if not res.ok:
                why = "timed out" if res.timed_out else f"exited {res.exit_code}"
                raise RuntimeError(f"install command {why}: {command}\n{res.output[-2000:]}")

    async def _verify(self, task: Task, workspace: Path) -> float | None:
        if task.verifier is None:
            return None
        sandbox = self.sandbox_factory()
        try:
            await sandbox.start()
            await sandbox.upload(workspace, sandbox.workdir)
            for path, content in task.verifier.files.items():
                await sandbox.write_file(path, content)
            reward_dir = f"{sandbox.scratch}/reward"
            res = await sandbox.exec(
                f"mkdir -p {reward_dir} && {task.verifier.command}",
                timeout=task.verifier.timeout_s,
                env={"RLGW_REWARD_DIR": reward_dir},
            )
            if res.timed_out:
                raise TimeoutError(f"verifier ran past {task.verifier.timeout_s:.0f}s")
            return parse_reward(
                await _read_optional(sandbox, f"{reward_dir}/reward.json"),
                await _read_optional(sandbox, f"{reward_dir}/reward.txt"),
                res.exit_code,
            )
        finally:
            await _stop_quietly(sandbox)

    async def _collect_logs(self, sandbox: Sandbox, ctx: ScaffoldContext) -> dict[str, bytes]:
        logs = {}
        for name, path in self.scaffold.log_paths(ctx).items():
            if (content := await _read_optional(sandbox, path)) is not None:
                logs[name] = content
        return logs

    def _save_artifacts(self, result: RunResult, logs: dict[str, bytes], output: str, frozen: Path) -> None:
        if self.config.artifacts_dir is None:
            return
        dest = self.config.artifacts_dir / f"{result.task_id}-{result.rollout_id[:8]}"
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "output.txt").write_text(output)
        for name, content in logs.items():
            (dest / f"log-{name}").write_bytes(content)
        if (frozen / "workspace").exists():
            shutil.copytree(frozen / "workspace", dest / "workspace", dirs_exist_ok=True)

    async def _finish(self, result: RunResult) -> None:
        assert self.gateway is not None and result.session_id is not None
        summary = await self.gateway.finish_session(
            result.session_id,
            # An infra failure says nothing about the policy: its samples carry no reward signal.
            reward=result.reward if result.reward is not None else 0.0,
            status=result.status,
            termination_reason=str(result.termination),
            metadata={
                "failed_stage": result.failed_stage,
                "turns": result.turns,
                "exit_code": result.exit_code,
                "detail": result.detail[:500] or None,
            },
        )
        _take_summary(result, summary)

    async def _delete_quietly(self, session_id: str | None) -> None:
        if self.gateway is None or session_id is None:
            return
        try:
            await self.gateway.delete_session(session_id)
        except Exception as e:  # teardown must go on; the gateway reaps idle sessions anyway
            log.warning("session delete failed", extra={"fields": {"session": session_id, "error": str(e)}})


def _take_summary(result: RunResult, summary: FinishSummary) -> None:
    """Copy what the finish stored onto the result."""
    result.trainable_tokens = summary.trainable_tokens
    result.samples = [
        {"cursor": s.cursor, "segment": s.segment, "trainable_tokens": s.trainable_tokens,
         "response_length": s.response_length}
        for s in summary.samples
    ]  # fmt: skip
    result.rejects = [{"segment": r.segment, "reason": r.reason, "detail": r.detail} for r in summary.rejects]


def _recover(result: RunResult, summary: FinishSummary) -> None:
    """Make `result` the run whose finish the gateway had already stored, from its summary."""
    _take_summary(result, summary)
    result.session_id, result.reward, result.status = summary.session_id, summary.reward, summary.status
    reasons = {str(r): r for r in TerminationReason}
    result.termination = reasons.get(summary.termination_reason or "")
    result.detail = f"recovered: the rollout is already stored (session {summary.session_id})"
    result.recovered = True
    log.info("task run recovered", extra={"fields": {"task": result.task_id, "session": summary.session_id}})


async def _stage(name: str, awaitable: Any) -> Any:
    """Await one lifecycle stage, tagging any failure with the stage's name."""
    try:
        return await awaitable
    except Exception as e:
        raise _StageFailed(name, e) from e


async def _read_optional(sandbox: Sandbox, path: str) -> bytes | None:
    try:
        return await sandbox.read_file(path)
    except SandboxFileNotFound:
        return None


async def _stop_quietly(sandbox: Sandbox) -> None:
    try:
        await sandbox.stop()
    except Exception as e:
        log.warning("sandbox stop failed", extra={"fields": {"sandbox": sandbox.id, "error": str(e)}})
