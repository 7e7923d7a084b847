"""miniengine: the course's mini LLM inference engine.

    from miniengine import LLM, SamplingParams
    llm = LLM(model="data/models/target")
    print(llm.generate("def fibonacci(n):", SamplingParams(temperature=0, max_tokens=32))[0].text)
"""
from miniengine.config import EngineConfig
from miniengine.llm import LLM
from miniengine.outputs import RequestOutput
from miniengine.sampling import SamplingParams

__all__ = ["EngineConfig", "LLM", "RequestOutput", "SamplingParams"]
