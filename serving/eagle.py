"""A feature-level draft (EAGLE-style, with a reduced-vocabulary head as in FR-Spec).

The draft reads the target's own last hidden state f_t (the last block's output, before the final
norm) and the embedding of the next token x_{t+1}, and predicts the target's next hidden state:

    z_t   = fc([emb(x_{t+1}); f_t])            (B, T, 2C) -> (B, T, C)
    h_t   = decoder layer(s)(z_t)              causal, with its own KV cache;  h_t ~ f_{t+1}
    x_t+2 ~ head(norm(h_t))                    over the `head_vocab` most frequent tokens only

While drafting, the draft feeds its own h back in place of the target features it does not have yet;
after verification the real features of the accepted tokens replace them (the draft's KV cache is
rolled back and recomputed from the true features). The token embedding is the target's (shared, not
stored); the draft stores fc, its layer(s), norm, the reduced head and the head's token ids.

Fused features (EAGLE-3, Li et al. 2025): with `feature_layers` (two or more target blocks, e.g. a low, a
middle and the last one) the real feature is those blocks' outputs side by side, (.., n*C), and a linear
`fuse` maps it to C before fc:  g_t = fuse([f_t^low; f_t^mid; f_t^high]).  The draft's own h stands in for
g_t on later steps, so training regresses h_t on the draft's own g_{t+1} (serving/distill/train.py), not on
any one target layer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from serving.llama import (
    Block,
    CausalLM,
    ForwardBatch,
    KVCache,
    ModelConfig,
    RMSNorm,
    RopeScaling,
    rope_tables,
)

MODEL_TYPE = "specfinops-eagle"
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EagleConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    head_vocab: int  # tokens the draft can propose
    num_layers: int = 1
    rms_eps: float = 1e-5
    rope_theta: float = 10_000.0
    max_position: int = 2048
    feature_layers: tuple[int, ...] = ()  # target blocks whose outputs are fused; () = the last block only
    attention_bias: bool = False  # biases on q, k, v, as the target's blocks (Qwen2) it starts from
    rope_scaling: RopeScaling | None = None  # the target's rope rescale (llama3, linear); None = plain rope

    def __post_init__(self):
        if isinstance(self.rope_scaling, dict):  # as config.json stores it
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        layers = tuple(int(i) for i in self.feature_layers)
        if layers and (len(layers) < 2 or list(layers) != sorted(set(layers)) or layers[0] < 0):
            raise ValueError(f"feature_layers must be two or more distinct block indices in increasing order, "
                             f"got {list(layers)}")
        object.__setattr__(self, "feature_layers", layers)

    @property
    def feature_width(self) -> int:
        """Width of the target features this draft reads: C, or n*C for n fused blocks."""
        return self.hidden_size * max(len(self.feature_layers), 1)

    def layer_config(self) -> ModelConfig:
        return ModelConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_layers=self.num_layers, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim, rms_eps=self.rms_eps, rope_theta=self.rope_theta, max_position=self.max_position,
            attention_bias=self.attention_bias, rope_scaling=self.rope_scaling,
        )

    @classmethod
    def for_target(cls, target: ModelConfig, head_vocab: int, num_layers: int = 1,
                   feature_layers: tuple[int, ...] = ()) -> EagleConfig:
        if feature_layers and feature_layers[-1] >= target.num_layers:
            raise ValueError(f"feature_layers {list(feature_layers)}: the target has blocks 0..{target.num_layers - 1}")
        if not 1 <= num_layers <= target.num_layers:  # a draft starts from the target's last num_layers blocks
            raise ValueError(f"a draft of {num_layers} layers: the target has {target.num_layers} blocks to start "
                             "it from")
        return cls(hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
                   num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                   vocab_size=target.vocab_size, head_vocab=head_vocab, num_layers=num_layers,
                   rms_eps=target.rms_eps, rope_theta=target.rope_theta, max_position=target.max_position,
                   feature_layers=tuple(feature_layers), attention_bias=target.attention_bias,
                   rope_scaling=target.rope_scaling)


class EagleDraft(nn.Module):
    def __init__(self, cfg: EagleConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.cfg = cfg
        self.layer_cfg = cfg.layer_config()
        self.embed = [embed_tokens]  # the target's table: shared, not a registered (saved) submodule
        self.fuse = nn.Linear(cfg.feature_width, cfg.hidden_size, bias=False) if cfg.feature_layers else None
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList(Block(self.layer_cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.head = nn.Linear(cfg.hidden_size, cfg.head_vocab, bias=False)
        self.register_buffer("head_token_ids", torch.zeros(cfg.head_vocab, dtype=torch.long))
        cos, sin = rope_tables(self.layer_cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @classmethod
    def init_from_target(cls, target: CausalLM, head_token_ids: torch.Tensor, num_layers: int = 1,
                         feature_layers: tuple[int, ...] = ()) -> EagleDraft:
        """Start from the target: its last layer(s), final norm and the head rows of the kept tokens; a fuse
        that passes the last block's output through (the mean of the fused blocks if the last is not one)."""
        cfg = EagleConfig.for_target(target.cfg, head_vocab=len(head_token_ids), num_layers=num_layers,
                                     feature_layers=feature_layers)
        draft = cls(cfg, target.embed_tokens)
        with torch.no_grad():
            for i, layer in enumerate(draft.layers):
                layer.load_state_dict(target.layers[target.cfg.num_layers - num_layers + i].state_dict())
            draft.norm.weight.copy_(target.norm.weight)
            draft.head.weight.copy_(target.lm_head.weight[head_token_ids])
            draft.head_token_ids.copy_(head_token_ids)
            c = cfg.hidden_size
            draft.fc.weight.zero_()
            draft.fc.weight[:, c:] = torch.eye(c)  # starts as "the feature itself"
            draft.fc.weight[:, :c] = 0.1 * torch.eye(c)
            if draft.fuse is not None:
                fl = cfg.feature_layers
                draft.fuse.weight.zero_()
                picks = [fl.index(target.cfg.num_layers - 1)] if fl[-1] == target.cfg.num_layers - 1 else range(len(fl))
                for i in picks:
                    draft.fuse.weight[:, i * c:(i + 1) * c] = torch.eye(c) / len(picks)
        return draft

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        return KVCache(self.layer_cfg, self.cfg.num_layers, slots, min(max_len, self.cfg.max_position),
                       self.fc.weight.dtype)

    def forward(self, next_tokens: torch.Tensor, feats: torch.Tensor, fb: ForwardBatch, cache: KVCache):
        """next_tokens (B, T) = x_{t+1}; feats (B, T, C) = f_t, or with fused features either the target's
        (B, T, n*C) (fused here) or the draft's own h (B, T, C). Returns (h (B, T, C), reduced logits (B, T, Vh))."""
        if self.fuse is not None and feats.shape[-1] != self.cfg.hidden_size:
            feats = self.fuse(feats)
        emb = self.embed[0](next_tokens).to(feats.dtype)  # (B, T, C)
        x = self.fc(torch.cat([emb, feats], dim=-1))  # (B, T, C)
        cos = self.rope_cos[fb.positions].unsqueeze(1).to(x.dtype)
        sin = self.rope_sin[fb.positions].unsqueeze(1).to(x.dtype)
        for block in self.layers:
            x = block(x, cos, sin, cache, fb)
        return x, self.head(self.norm(x)).float()

    def head_index(self) -> torch.Tensor:
        """(V,) full-vocabulary id -> the reduced head's row, -1 for tokens outside the head."""
        rows = torch.full((self.cfg.vocab_size,), -1, dtype=torch.long)
        rows[self.head_token_ids] = torch.arange(self.cfg.head_vocab)
        return rows

    def full_logits(self, reduced: torch.Tensor) -> torch.Tensor:
        """Reduced logits (..., Vh) -> full-vocabulary logits (..., V) with -inf outside the head."""
        full = reduced.new_full((*reduced.shape[:-1], self.cfg.vocab_size), float("-inf"))
        full[..., self.head_token_ids] = reduced
        return full

    # ------------------------------------------------------------------ files
    def save(self, out_dir: str | Path, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(out / "model.safetensors"))
        cfg = {"model_type": MODEL_TYPE, **asdict(self.cfg), **(extra or {})}
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def is_eagle_dir(path: str | Path) -> bool:
    """Whether `path` holds a feature draft (config.json's model_type). ValueError naming config.json when it is
    not JSON."""
    from serving.models import read_config

    return (Path(path) / "config.json").is_file() and read_config(path).get("model_type") == MODEL_TYPE


def read_card(path: str | Path) -> dict | None:
    """A draft folder's model_card.json as a dict; None where it has none (a draft made otherwise) or it is no
    JSON object: nothing is said of such a draft."""
    try:
        card = json.loads((Path(path) / "model_card.json").read_text())
    except (OSError, ValueError):
        return None
    return card if isinstance(card, dict) else None


def unfinished_note(path: str | Path) -> str | None:
    """What to say of a draft folder whose model_card.json says its training did not finish (`distill` writes
    the draft so far at each checkpoint, and a Ctrl-C leaves it so): whole files that load like a finished
    draft, but not the draft the run was to make. None for a finished draft, or one without a card: a card saying
    'trained; evaluation interrupted (...)' is a finished draft too (training wrote its final weights before the
    evaluation began; only its alpha and c were not measured)."""
    card = read_card(path)
    status = card.get("status") if card is not None else None
    if status is None or is_trained_status(status):
        return None
    results = card.get("results")
    steps = results.get("steps") if isinstance(results, dict) else None
    return (f"draft {path} is not a finished draft: its model_card.json says {status!r}"
            + (f" (step {steps})" if steps is not None else "") + "; a distill run stopped or still running wrote "
            "it, so what it measures is not the finished draft's: resume that run (its command with --resume)")


def is_trained_status(status) -> bool:
    """Whether a model card's status says the training finished: "trained", or "trained; ..." where only what
    followed it (the evaluation) was interrupted."""
    return isinstance(status, str) and (status == "trained" or status.startswith("trained;"))


def unmeasured_note(path: str | Path) -> str | None:
    """A note (not a warning) for a finished draft whose distill evaluation was interrupted: its card has no alpha
    or c. None otherwise."""
    card = read_card(path)
    status = card.get("status") if card is not None else None
    if not is_trained_status(status) or status == "trained":
        return None
    return (f"draft {path}: its training finished but distill's evaluation was interrupted, so its model card "
            "holds no measured alpha or c")


def _target_names(target_dir: Path) -> set[str]:
    """What a model card may call the target in `target_dir` (lower case): its folder's name, its hub id and that
    id's model part where it is a Hugging Face cache snapshot, the bundled target's name where it is that one."""
    from serving.models import BUNDLED_TARGET, is_bundled_target
    from telemetry.labels import hub_id

    names = {target_dir.name}
    hub = hub_id(target_dir)
    if hub:
        names |= {hub, hub.rsplit("/", 1)[-1]}
    if is_bundled_target(target_dir):
        names.add(BUNDLED_TARGET)
    return {n.lower() for n in names}


def foreign_target_note(path: str | Path, target_dir: str | Path) -> str | None:
    """What to say of a feature draft distilled for another target than the one in `target_dir`, by its
    model_card.json: the fingerprint of the target's weights distill records (`target_weights_fingerprint`),
    compared with this target's, and where the card records it the fingerprint of its config.json
    (`target_config_fingerprint`: the same weights under another rope_theta or eos_token_id answer otherwise);
    on a card from before it recorded the weights', the target's name. A draft of another
    target of the same shape (SmolLM2-135M base for the instruct model) loads and runs, and only accepts less: a
    warning, not a refusal (a draft may serve a fine-tune of its target on purpose). None where the card names
    this target, or there is no card (a draft made otherwise) or no target in it."""
    from serving.models import config_fingerprint, weights_fingerprint

    path, target_dir = Path(path), Path(target_dir)
    card = read_card(path)
    if card is None:
        return None
    made_for, theirs = card.get("target"), card.get("target_weights_fingerprint")
    made_for = made_for if isinstance(made_for, str) and made_for else None
    tail = "; it loads, but its drafts were fitted to that model's outputs and acceptance will suffer"
    if isinstance(theirs, str) and theirs:
        ours = weights_fingerprint(target_dir)
        if ours is None:
            return None
        if ours == theirs:
            their_cfg = card.get("target_config_fingerprint")
            our_cfg = config_fingerprint(target_dir) if isinstance(their_cfg, str) and their_cfg else None
            if our_cfg is None or our_cfg == their_cfg:
                return None
            return (f"draft {path} was distilled for {made_for or 'a target'} with these weights ({theirs}) but "
                    f"another config.json (config {their_cfg}), not this target {target_dir}'s (config {our_cfg})"
                    f"{tail}: distill a draft for this target, or give the target the config.json it was made for")
        return (f"draft {path} was distilled for {made_for or 'another target'} (weights {theirs}), not this target "
                f"{target_dir} (weights {ours}){tail}: distill a draft for this target")
    if made_for is None or made_for.lower() in _target_names(target_dir):
        return None
    return (f"draft {path} was distilled for {made_for}, and this target is {target_dir}{tail} unless it is the "
            "same model under another name")


def load_eagle(path: str | Path, target: CausalLM, dtype: torch.dtype,
               target_dir: str | Path | None = None) -> EagleDraft:
    """A feature draft directory (config.json + model.safetensors) for `target`. What is wrong with its files
    (not JSON, not safetensors, weights of another config) is a ValueError naming the file, as `load_causal_lm`
    does for a model directory. With `target_dir` (where `target` was loaded from), a draft whose model card
    names another target is a warning (`foreign_target_note`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from serving.models import read_config

    path = Path(path)
    raw = read_config(path)
    required = [k for k, f in EagleConfig.__dataclass_fields__.items() if f.default is MISSING]
    missing = [k for k in required if raw.get(k) is None]
    if missing:
        raise ValueError(f"{path / 'config.json'} has no {', '.join(missing)}: not the config of a feature draft")
    fields = {k: raw[k] for k in EagleConfig.__dataclass_fields__ if k in raw}
    try:
        cfg = EagleConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path / 'config.json'}: {str(exc).strip().splitlines()[0]}") from None
    if cfg.feature_layers and cfg.feature_layers[-1] >= target.cfg.num_layers:
        raise ValueError(f"draft {path} fuses target blocks {list(cfg.feature_layers)}; this target has "
                         f"{target.cfg.num_layers}")
    if cfg.vocab_size != target.cfg.vocab_size or cfg.hidden_size != target.cfg.hidden_size:
        raise ValueError(
            f"draft {path} was trained for a target with vocabulary {cfg.vocab_size} and hidden size "
            f"{cfg.hidden_size}; this target has {target.cfg.vocab_size} and {target.cfg.hidden_size}"
        )
    if note := unmeasured_note(path):
        logger.info(note)
    for note in (unfinished_note(path), foreign_target_note(path, target_dir) if target_dir is not None else None):
        if note:
            logger.warning(note)
    draft = EagleDraft(cfg, target.embed_tokens)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{path} has no model.safetensors (the draft's weights)")
    try:
        state = load_file(str(weights))
    except SafetensorError as exc:  # truncated, or not a safetensors file at all
        raise ValueError(f"{weights}: not a readable safetensors file ({exc})") from None
    broken = next((k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())), None)
    if broken is not None:  # a training run that diverged: every proposal would be noise, accepted never
        raise ValueError(f"draft {path}: its weights hold NaN or infinite values ({broken} in {weights.name}), as a "
                         "distill run that diverged leaves them: distill it again (a lower --lr)")
    try:
        draft.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    except RuntimeError as exc:  # "Error(s) in loading state_dict for EagleDraft:" and one line per difference
        details = "; ".join(line.strip() for line in str(exc).splitlines()[1:] if line.strip())
        raise ValueError(f"{weights} does not match {path / 'config.json'} ({details[:300] or exc})") from None
    return draft.to(dtype).eval()
