"""User-supplied Hugging Face model directories: what the torch engine computes as transformers does, and one
clear line naming the directory for what it does not (tiny random models built with transformers)."""

from __future__ import annotations

import json

import pytest
import torch

from serving.llama import contiguous_batch, load_causal_lm

VOCAB = 96
TINY_HF = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=1, pad_token_id=0,
               tie_word_embeddings=False, initializer_range=0.2)


def hf_dir(path, kind: str = "llama", tokenizer: bool = True, seed: int = 0, **overrides):
    """A tiny random transformers model saved as a Hugging Face directory (config, safetensors and, with
    `tokenizer`, a word-level tokenizer of VOCAB tokens with an EOS)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

    config = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}[kind](**{**TINY_HF, **overrides})
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    if tokenizer:
        n = overrides.get("vocab_size", VOCAB) if tokenizer is True else tokenizer
        vocab = {"<unk>": 0, "</s>": 1, **{f"w{i}": i for i in range(2, n)}}
        tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = Whitespace()
        tok.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                "eos_token": "</s>", "unk_token": "<unk>"}))
    return path


def max_logit_difference(path, tokens: int = 40) -> float:
    """max |our logits - transformers' logits| over one float32 forward of `tokens` random ids."""
    from transformers import AutoModelForCausalLM

    ours = load_causal_lm(path, torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(ids).logits
        got = ours(ids, contiguous_batch(0, 1, 0, tokens), ours.new_cache(1, tokens + 8))
    return (want - got).abs().max().item()


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_supported_families_compute_what_transformers_computes(kind, tmp_path):
    assert max_logit_difference(hf_dir(tmp_path / kind, kind, tokenizer=False)) < 1e-4


@pytest.mark.parametrize(("kind", "overrides", "needle"), [
    ("llama", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("llama", {"hidden_act": "relu"}, "hidden_act 'relu'"),
])
def test_a_config_the_engine_does_not_compute_is_refused_naming_the_directory(kind, overrides, needle, tmp_path):
    path = hf_dir(tmp_path / "model", kind, tokenizer=False, **overrides)
    with pytest.raises(ValueError, match=needle) as err:
        load_causal_lm(path, torch.float32)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("kind", "overrides"), [
    ("mistral", {"sliding_window": 128}),  # a window as long as the context is full attention
    ("mistral", {"sliding_window": None}),
    ("qwen2", {"use_sliding_window": False, "sliding_window": 8}),  # Qwen2 ignores its window unless told to use it
    ("llama", {"hidden_act": "silu"}),
])
def test_a_window_or_activation_the_engine_computes_exactly_is_accepted(kind, overrides, tmp_path):
    assert max_logit_difference(hf_dir(tmp_path / "model", kind, tokenizer=False, **overrides)) < 1e-4


@pytest.mark.parametrize(("kind", "overrides"), [
    ("mistral", {"sliding_window": 24}),  # Mistral-7B-v0.1: a 4096-token window, 32768 positions
    ("qwen2", {"use_sliding_window": True, "sliding_window": 24, "max_window_layers": 0}),
])
def test_a_window_shorter_than_the_context_caps_the_context_at_the_window(kind, overrides, tmp_path):
    """Within its window sliding attention is full attention, so such a model runs exactly, up to the window:
    a longer prompt is refused as longer than the context window and an answer ends at it."""
    from serving.engine import Engine, EngineError
    from serving.sampling import SamplingParams

    path = hf_dir(tmp_path / "model", kind, tokenizer=False, **overrides)
    assert max_logit_difference(path, tokens=20) < 1e-4
    model = load_causal_lm(path, torch.float32)
    assert model.cfg.max_position == 24
    engine = Engine(model, max_len=2048)
    with pytest.raises(EngineError, match="prompt is 30 tokens; the context window \\(24 tokens\\) fits at most 22 prompt tokens"):
        engine.check_request(list(range(2, 32)), SamplingParams(max_new_tokens=4))
    seq = engine.add(list(range(2, 12)), SamplingParams(max_new_tokens=100))
    while not seq.done:
        engine.step()
    assert len(seq.tokens) <= 24


@pytest.mark.parametrize(("overrides", "positions", "source"), [
    ({"sliding_window": 24}, 24, "sliding_window"),
    ({"sliding_window": 4096}, 128, "max_position_embeddings"),  # a window past the positions limits nothing
    ({"sliding_window": None}, 128, "max_position_embeddings"),
])
def test_the_config_records_which_field_sets_the_context(overrides, positions, source):
    """Errors about the context name the field that limits it: a sliding_window shorter than
    max_position_embeddings is the limit (and no --max-len lifts it)."""
    from serving.llama import ModelConfig

    cfg = ModelConfig.from_hf({**TINY_HF, "model_type": "mistral", "hidden_act": "silu", **overrides})
    assert (cfg.max_position, cfg.max_position_source) == (positions, source)


def test_an_unsupported_model_type_names_the_directory(tmp_path):
    path = hf_dir(tmp_path / "model", tokenizer=False)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match=f"{path}: model_type 'gpt2' is not supported"):
        load_causal_lm(path, torch.float32)


@pytest.mark.parametrize("rope", [
    # Llama 3.1's own values but for a tiny context: frequencies kept, interpolated and divided all occur
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16, "rope_theta": 500000.0},
    {"rope_type": "linear", "factor": 2.0},
])
def test_rope_scaling_computes_what_transformers_computes(rope, tmp_path):
    """Llama 3.1+ checkpoints carry rope_type llama3: it runs, as transformers runs it."""
    from dataclasses import replace

    from serving.llama import rope_tables

    path = hf_dir(tmp_path / "model", tokenizer=False, rope_scaling=rope)
    assert max_logit_difference(path, tokens=100) < 1e-4
    cfg = load_causal_lm(path, torch.float32).cfg
    assert cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == rope["rope_type"]
    plain_cos, _ = rope_tables(replace(cfg, rope_scaling=None))
    assert (rope_tables(cfg)[0] - plain_cos).abs().max() > 0.1  # the scaling changed what the test compared


def test_an_unsupported_rope_scaling_names_the_directory_and_the_type(tmp_path):
    path = hf_dir(tmp_path / "model", tokenizer=False,
                  rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match=f"{path}: rope scaling 'dynamic' is not supported .*llama3"):
        load_causal_lm(path, torch.float32)


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_at_load(tmp_path):
    """Its ids past vocab_size have no embedding: an IndexError in the middle of a run, before this check."""
    from serving.models import load_tokenizer

    path = hf_dir(tmp_path / "model", tokenizer=VOCAB + 32, vocab_size=VOCAB)
    with pytest.raises(ValueError, match=f"tokenizer of {path} has {VOCAB + 32} tokens but its config.json "
                                         f"vocab_size is {VOCAB}"):
        load_tokenizer(path)
    assert len(load_tokenizer(hf_dir(tmp_path / "smaller", tokenizer=VOCAB - 8))) == VOCAB - 8  # padded tables: fine


def test_a_draft_without_tokenizer_files_is_one_line_naming_it(tmp_path):
    """check_same_vocab read it through transformers, whose multi-line message named no directory."""
    from serving.models import check_same_vocab

    target = hf_dir(tmp_path / "target")
    draft = hf_dir(tmp_path / "draft", tokenizer=False, num_hidden_layers=1)
    with pytest.raises(ValueError, match=f"{draft} has no tokenizer files \\(none of tokenizer.json, ") as err:
        check_same_vocab(target, draft)
    assert "\n" not in str(err.value)
    (draft / "tokenizer_config.json").write_text("{}")  # settings only: still no tokenizer
    with pytest.raises(ValueError, match=f"{draft} has no tokenizer files"):
        check_same_vocab(target, draft)
    (draft / "tokenizer.model").write_bytes(b"not sentencepiece")
    with pytest.raises(ValueError, match=f"{draft}: cannot load its tokenizer: ") as err:
        check_same_vocab(target, draft)
    assert "\n" not in str(err.value)


def test_a_config_without_a_required_field_or_not_json_is_one_line_naming_it(tmp_path):
    """A missing field was 'KeyError: 'intermediate_size'' (exit 1, naming no file)."""
    path = hf_dir(tmp_path / "model", tokenizer=False)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["intermediate_size"], cfg["num_hidden_layers"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"{path}: config.json has no intermediate_size, num_hidden_layers$"):
        load_causal_lm(path, torch.float32)
    (path / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match=f"{path / 'config.json'} is not valid JSON"):
        load_causal_lm(path, torch.float32)


def test_null_kv_heads_and_head_dim_mean_what_transformers_reads_them_as(tmp_path):
    """"num_key_value_heads": null crashed ('unsupported operand type(s) for *: 'NoneType' and 'int''); transformers
    reads it as plain multi-head attention, and a null head_dim as hidden_size // heads."""
    path = hf_dir(tmp_path / "model", tokenizer=False, num_key_value_heads=4)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": None, "head_dim": None}))
    model = load_causal_lm(path, torch.float32)
    assert model.cfg.num_kv_heads == 4 and model.cfg.head_dim == 8
    assert max_logit_difference(path) < 1e-4


@pytest.mark.parametrize("key", ["rope_theta", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                                 "attention_bias", "hidden_act"])
def test_a_null_field_without_a_default_is_one_line_naming_it(key, tmp_path):
    """transformers refuses these as null; they were a TypeError deep in loading (or, for the booleans, False)."""
    path = hf_dir(tmp_path / "model", tokenizer=False)
    cfg = json.loads((path / "config.json").read_text())
    cfg[key] = None
    if key == "rope_theta":
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": None}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as err:
        load_causal_lm(path, torch.float32)
    msg = str(err.value)
    assert msg.startswith(f"{path}: config.json has ") and key in msg.split("config.json has ")[1].split(" null:")[0]
    assert "\n" not in msg


def test_llama_attention_bias_is_refused_up_front_naming_it(tmp_path):
    """attention_bias true puts a bias on a Llama's o_proj too, which the engine's attention has not: it was
    refused as 'weights do not match the config (... unexpected ...o_proj.bias)'."""
    path = hf_dir(tmp_path / "model", tokenizer=False, attention_bias=True)
    with pytest.raises(ValueError) as err:
        load_causal_lm(path, torch.float32)
    assert str(err.value).startswith(f"{path}: attention_bias true is not supported by the torch engine for llama")
    assert "o_proj" in str(err.value) and "\n" not in str(err.value)


def test_llama_mlp_bias_is_refused_up_front_naming_it(tmp_path):
    """mlp_bias true puts biases on a Llama's MLP projections, which the engine's MLP has not: it was refused as
    'weights do not match the config (... unexpected ...gate_proj.bias)'."""
    path = hf_dir(tmp_path / "model", tokenizer=False, mlp_bias=True)
    with pytest.raises(ValueError) as err:
        load_causal_lm(path, torch.float32)
    assert str(err.value).startswith(f"{path}: mlp_bias true is not supported by the torch engine")
    assert "\n" not in str(err.value)


def test_weights_of_another_shape_than_the_config_are_one_line_naming_the_tensor(tmp_path):
    """A config.json whose vocab_size is not its weights' was a RuntimeError the CLI cut to 'Error(s) in loading
    state_dict for CausalLM'."""
    path = hf_dir(tmp_path / "model", tokenizer=False)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "vocab_size": VOCAB + 4}))
    with pytest.raises(ValueError) as err:
        load_causal_lm(path, torch.float32)
    assert str(err.value).startswith(f"{path}: weights do not match the config (embed_tokens.weight is "
                                     f"[{VOCAB}, 32] in the weights, the config implies [{VOCAB + 4}, 32]")
    assert "\n" not in str(err.value)


def sharded_with_consolidated(path):
    """A Hugging Face directory of shards and their index that also holds a Mistral-format consolidated.safetensors
    (other tensor names, as Mistral's repositories ship both)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY_HF)).save_pretrained(path, max_shard_size="20KB")
    state = {}
    for f in sorted(path.glob("model-*.safetensors")):
        state.update(load_file(str(f)))
    save_file({k.replace("model.embed_tokens", "tok_embeddings"): v for k, v in state.items()},
              str(path / "consolidated.safetensors"))
    return path


def test_an_index_names_the_weight_files_read_and_fingerprinted(tmp_path):
    """With a model.safetensors.index.json the loader reads the files its weight_map names, as transformers does:
    every *.safetensors loaded a consolidated.safetensors beside the shards too, and refused the pair
    ('unexpected [tok_embeddings.weight]') after holding both. The fingerprint of cached distill data reads the
    same files (the consolidated copy is no part of the model)."""
    from serving.distill.pipeline import target_fingerprint
    from serving.models import WEIGHTS_INDEX, weight_files

    path = sharded_with_consolidated(tmp_path / "model")
    assert (path / WEIGHTS_INDEX).is_file() and len(weight_files(path)) > 1
    assert (path / "consolidated.safetensors") not in weight_files(path)
    assert max_logit_difference(path) < 1e-4
    before = target_fingerprint(path)
    (path / "consolidated.safetensors").write_bytes(b"another file")
    assert target_fingerprint(path) == before


def test_an_index_naming_a_missing_shard_or_damaged_is_one_line_naming_it(tmp_path):
    from serving.models import WEIGHTS_INDEX

    path = sharded_with_consolidated(tmp_path / "model")
    index = json.loads((path / WEIGHTS_INDEX).read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (path / shard).unlink()
    with pytest.raises(ValueError) as err:
        load_causal_lm(path, torch.float32)
    assert str(err.value) == f"{path / WEIGHTS_INDEX} names weight files that are not in {path}: {shard}"
    (path / WEIGHTS_INDEX).write_text("{not json")
    with pytest.raises(ValueError, match="is not a safetensors index"):
        load_causal_lm(path, torch.float32)


def as_bin(path, shards: int = 0, legacy: bool = False):
    """`path`'s safetensors weights rewritten in transformers' older torch.save format: one pytorch_model.bin, or
    `shards` pytorch_model-*.bin with their pytorch_model.bin.index.json; `legacy`, torch's pre-zip format."""
    from safetensors.torch import load_file

    from serving.models import weight_files

    state = {}
    for f in weight_files(path):
        state.update(load_file(str(f)))
        f.unlink()
    (path / "model.safetensors.index.json").unlink(missing_ok=True)
    kw = {"_use_new_zipfile_serialization": False} if legacy else {}
    if not shards:
        torch.save(state, path / "pytorch_model.bin", **kw)
        return path
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        name = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {k: state[k] for k in names[i::shards]}
        torch.save(part, path / name, **kw)
        weight_map.update(dict.fromkeys(part, name))
    (path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def logits(path, tokens: int = 20):
    model = load_causal_lm(path, torch.float32)
    ids = torch.arange(2, 2 + tokens)[None]
    with torch.no_grad():
        return model(ids, contiguous_batch(0, 1, 0, tokens), model.new_cache(1, tokens + 8))


@pytest.mark.parametrize(("shards", "legacy"), [(0, False), (3, False), (0, True)])
def test_pytorch_model_bin_weights_load_as_the_safetensors_do(shards, legacy, tmp_path):
    """A folder with only pytorch_model.bin (or its shards and index) was refused: 'has no *.safetensors weights'.
    It computes what the same weights as safetensors do, and has a weights fingerprint (drafter labels, distill)."""
    from serving.distill.pipeline import target_fingerprint
    from serving.models import weight_files, weights_fingerprint

    want = logits(hf_dir(tmp_path / "st"))
    path = as_bin(hf_dir(tmp_path / "bin"), shards, legacy)
    assert not list(path.glob("*.safetensors")) and len(weight_files(path)) == max(shards, 1)
    assert torch.equal(logits(path), want)
    assert weights_fingerprint(path) and target_fingerprint(path)
    (path / "training_args.bin").write_bytes(b"not weights")  # another *.bin is no part of the model
    assert len(weight_files(path)) == max(shards, 1)


def test_safetensors_are_preferred_over_pytorch_model_bin_and_a_folder_without_either_is_named(tmp_path):
    from serving.models import weight_files

    path = hf_dir(tmp_path / "model")
    torch.save({"nothing": torch.zeros(1)}, path / "pytorch_model.bin")  # would not load: must not be read
    assert weight_files(path) == [path / "model.safetensors"]
    assert logits(path).shape[-1] == VOCAB
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(ValueError) as err:
        load_causal_lm(path, torch.float32)
    assert str(err.value).startswith(f"{path / 'pytorch_model.bin'}: not a readable PyTorch weights file (")
    assert "\n" not in str(err.value)
    (path / "pytorch_model.bin").unlink()
    with pytest.raises(ValueError) as err:
        load_causal_lm(path, torch.float32)
    assert str(err.value) == f"{path} has no weights (*.safetensors or pytorch_model.bin)"


def test_a_whole_pytorch_model_bin_beside_a_stale_index_loads_as_transformers_reads_it(tmp_path):
    """transformers reads pytorch_model.bin before pytorch_model.bin.index.json; the index was taken first, so a
    folder with a working pytorch_model.bin and an index naming shards no longer there was refused."""
    from serving.models import weight_files

    want = logits(hf_dir(tmp_path / "st"))
    path = as_bin(hf_dir(tmp_path / "bin"))
    stale = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "pytorch_model-00001-of-00002.bin"}}
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(stale))
    assert weight_files(path) == [path / "pytorch_model.bin"]
    assert torch.equal(logits(path), want)
