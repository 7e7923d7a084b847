"""The engine core, one concept per module, in the shape of nano-vllm and vLLM:

    LLMEngine.step() = Scheduler.schedule() -> ModelRunner.run() -> Scheduler.postprocess()

sequence.py (a request's state), policy.py (who joins a step), scheduler.py
(budgets and the one stop rule), batch.py (what a step feeds, and what its rows
emit), model_runner.py (flatten, run, sample),
llm_engine.py (the loop), replay.py (an arrival trace on the wall clock).
"""
from miniengine.engine.llm_engine import LLMEngine
from miniengine.engine.replay import TraceRequest, replay
from miniengine.engine.policy import Budget, ContinuousBatching, FCFSPolicy, StaticBatching
from miniengine.engine.scheduler import ScheduledBatch, Scheduler
from miniengine.engine.sequence import Sequence, SequenceStatus

__all__ = ["LLMEngine", "TraceRequest", "replay", "Budget", "ContinuousBatching", "FCFSPolicy", "StaticBatching", "ScheduledBatch", "Scheduler", "Sequence", "SequenceStatus"]
