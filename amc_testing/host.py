"""A host agent in-process, or a fake host's reports built as the agent builds them, for
the harnesses (see the package's docstring)."""

from amc_common.statuses import Outcome
from host_agent.__main__ import RECONNECT
from host_agent.adb import AdbSource
from host_agent.agent import Agent
from host_agent.clean_profile import CleanProfile, Profiles
from host_agent.config import AgentSettings
from host_agent.flag_values import duration
from host_agent.reporting import ResultBatcher
from host_agent.results import RunResult, StepResult, StepStatus
from host_agent.retry import RetryPolicy
from host_agent.simulated import SimulatedSource
from host_agent.wire import report_request

__all__ = [
    "RECONNECT",
    "AdbSource",
    "Agent",
    "AgentSettings",
    "CleanProfile",
    "Outcome",
    "Profiles",
    "ResultBatcher",
    "RetryPolicy",
    "RunResult",
    "SimulatedSource",
    "StepResult",
    "StepStatus",
    "duration",
    "report_request",
]
