"""miniengine: the course's mini LLM inference engine.

    from miniengine import LLM, SamplingParams
    llm = LLM(model="data/models/target")
    print(llm.generate("def fibonacci(n):", SamplingParams(temperature=0, max_tokens=32))[0].text)
"""
from .config import EngineConfig
from .llm import LLM
from .outputs import RequestOutput
from .sampling import SamplingParams

__all__ = ["EngineConfig", "LLM", "RequestOutput", "SamplingParams"]
