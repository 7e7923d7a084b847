"""Interactive explorers for the lecture notebooks: ipywidgets for the controls, matplotlib for the charts.

Each explorer keeps its computation in plain methods (``step``, ``distribution``,
``figure``) and wires the widgets on top, so a notebook run by papermill, where
nobody clicks, can drive the same code by calling the methods.  ipywidgets is
imported only when a widget is built: the engine itself never needs it.
"""
from __future__ import annotations

import html

import numpy as np
import torch

from miniengine.attention import NoCacheBackend
from miniengine.sampling import SamplingParams, sample_token, softmax


class DecodingExplorer:
    """Step through autoregressive decoding one token at a time.

    At every step the model reads the whole text so far (naive decode: no cache)
    and returns logits for the next token.  The chart shows the ``top`` most
    likely next tokens after temperature scaling; the chosen token comes from the
    course's sampler (Gumbel-max, noise keyed by (seed, position)), so the same
    seed and temperature always choose the same token.  Temperature 0 is greedy.
    """

    def __init__(self, model, tokenizer, prompt: str, seed: int = 0, temperature: float = 0.8, top: int = 10):
        self.model, self.tokenizer = model, tokenizer
        self.prompt_ids = tokenizer.encode(prompt).ids
        if not self.prompt_ids:
            raise ValueError("prompt must encode to at least 1 token, got an empty prompt")
        self.generated: list[int] = []
        self.seed, self.temperature, self.top = seed, float(temperature), int(top)
        self._logits = None  # logits for the current prefix; a new temperature reuses them, a new token does not

    # ------------------------------------------------------------ computation

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.generated

    def next_logits(self) -> np.ndarray:
        """Logits for the token at position len(ids): one forward pass over the whole prefix."""
        if self._logits is None:
            ids = self.ids
            n = len(ids)
            device = self.model.device
            with torch.inference_mode():
                out = self.model(torch.tensor(ids, device=device), torch.arange(n, device=device),
                                 NoCacheBackend([n]), logits_indices=torch.tensor([n - 1], device=device))
            self._logits = out[0].double().cpu().numpy()
        return self._logits

    def distribution(self, temperature: float | None = None) -> np.ndarray:
        """The probabilities the sampler draws from: softmax(logits / T); one-hot on the argmax when T = 0."""
        t = self.temperature if temperature is None else float(temperature)
        logits = self.next_logits()
        if t == 0:
            probs = np.zeros_like(logits)
            probs[np.argmax(logits)] = 1.0
            return probs
        return softmax(logits / t)

    def choice(self, temperature: float | None = None) -> int:
        """The token the sampler picks now, at this temperature (top-k and top-p are off)."""
        t = self.temperature if temperature is None else float(temperature)
        params = SamplingParams(temperature=t, seed=self.seed, max_tokens=1)
        return sample_token(self.next_logits(), params, position=len(self.ids))

    def step(self) -> int:
        """Append the chosen token: one click of "next step"."""
        token = self.choice()
        self.generated.append(token)
        self._logits = None
        return token

    def reset(self) -> None:
        self.generated = []
        self._logits = None

    def piece(self, token_id: int) -> str:
        """The text of one token."""
        return self.tokenizer.decode([int(token_id)])

    def label(self, token_id: int) -> str:
        """The text of one token with its whitespace made visible: · for a space, \\n for a newline, \\t for a tab."""
        return self.piece(token_id).replace(" ", "·").replace("\n", "\\n").replace("\t", "\\t")

    # ------------------------------------------------------------ drawing

    def figure(self):
        """A bar chart of the top next-token probabilities, with the chosen token in orange."""
        import matplotlib.pyplot as plt

        probs = self.distribution()
        chosen = self.choice()
        top = np.argsort(-probs, kind="stable")[: self.top]
        labels = [self.label(t) for t in top]
        colors = ["tab:orange" if t == chosen else "tab:blue" for t in top]

        fig, ax = plt.subplots(figsize=(7, 0.32 * len(top) + 1.2))
        ax.barh(range(len(top)), probs[top], color=colors)
        ax.set_yticks(range(len(top)), labels, fontfamily="monospace")
        ax.invert_yaxis()  # most likely at the top
        ax.set_xlim(0, 1)
        ax.set_xlabel("probability of being the next token")
        for y, t in enumerate(top):
            ax.text(probs[t] + 0.01, y, f"{probs[t]:.3f}", va="center", fontsize=8)
        mode = "greedy" if self.temperature == 0 else f"temperature {self.temperature:g}, seed {self.seed}"
        where = "" if chosen in top else f"\nthe chosen token, {self.label(chosen)}, is outside the top {self.top}"
        ax.set_title(f"step {len(self.generated) + 1} (position {len(self.ids)}): the top {len(top)} hold "
                     f"{probs[top].sum():.0%} of the probability; {mode}{where}", fontsize=9)
        fig.tight_layout()
        return fig

    def text_html(self) -> str:
        """The text so far: the prompt in grey, each generated token on its own shaded background."""
        prompt = html.escape(self.tokenizer.decode(self.prompt_ids))
        spans = "".join(
            f'<span style="background:#ffe0b3;border-right:1px solid #fff">{html.escape(self.piece(t))}</span>'
            for t in self.generated
        )
        return (f'<pre style="white-space:pre-wrap;margin:0"><span style="color:#777">{prompt}</span>{spans}</pre>'
                f"<small>{len(self.prompt_ids)} prompt tokens, {len(self.generated)} generated</small>")

    def widget(self):
        """The explorer: the text, a temperature slider, "next step" and "reset" buttons, and the live chart."""
        import ipywidgets as widgets
        import matplotlib.pyplot as plt
        from IPython.display import display

        text = widgets.HTML()
        chart = widgets.Output()
        slider = widgets.FloatSlider(value=self.temperature, min=0.0, max=2.0, step=0.05, description="temperature",
                                     continuous_update=True, readout_format=".2f")
        step_button = widgets.Button(description="next step", button_style="primary")
        reset_button = widgets.Button(description="reset")

        def redraw():
            text.value = self.text_html()
            with chart:
                chart.clear_output(wait=True)
                fig = self.figure()
                display(fig)
                plt.close(fig)  # the Output widget holds the image; keep no figure open behind it

        def on_temperature(change):
            self.temperature = float(change["new"])
            redraw()  # same logits, new temperature: no forward pass needed

        def on_step(_):
            self.step()
            redraw()

        def on_reset(_):
            self.reset()
            redraw()

        slider.observe(on_temperature, names="value")
        step_button.on_click(on_step)
        reset_button.on_click(on_reset)
        redraw()
        return widgets.VBox([text, widgets.HBox([slider, step_button, reset_button]), chart])
