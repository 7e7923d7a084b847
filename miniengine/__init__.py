"""miniengine: the course's mini LLM inference engine.

    from miniengine import LLM, SamplingParams
    llm = LLM(model="data/models/target")
    print(llm.generate("def fibonacci(n):", SamplingParams(temperature=0, max_tokens=32))[0].text)
"""
from .engine import LLM, RequestOutput
from .sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
