"""Model cards: parameter counts against published totals, and Hugging Face import."""

import pytest

from tests.conftest import ROOT
from transit_launch.errors import UsageError
from transit_launch.planning.models import catalog, load_model

# (name, published total in billions, published active in billions)
PUBLISHED = [
    ("llama3-8b", 8.03, None),
    ("llama3-70b", 70.55, None),
    ("llama3-405b", 405.85, None),
    ("llama4-scout", 107.77, 17.17),  # text decoder; Meta's 109B adds the vision encoder
    ("qwen3-32b", 32.76, None),
    ("qwen3-30b-a3b", 30.53, 3.35),  # Qwen reports 30.5B total, 3.3B activated
]


@pytest.mark.parametrize("name,total,active", PUBLISHED)
def test_catalog_counts_match_published(name, total, active):
    card = catalog()[name]
    assert round(card.params / 1e9, 2) == pytest.approx(total, abs=0.01)
    assert abs(card.params - card.published_params) / card.published_params < 0.002
    if active is not None:
        assert round(card.active_params / 1e9, 2) == pytest.approx(active, abs=0.01)
    else:
        assert card.active_params == card.params


def test_issue_examples_exactly():
    assert f"{load_model('llama3-70b').params / 1e9:.2f}" == "70.55"
    assert f"{load_model('qwen3-30b-a3b').params / 1e9:.1f}" == "30.5"


def test_llama3_70b_by_hand():
    h, q, kv, f, v, L = 8192, 8192, 1024, 28672, 128256, 80
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * f + 2 * h
    assert load_model("llama3-70b").params == L * per_layer + 2 * v * h + h


HF = {
    "llama3-8b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                  "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
                  "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
                  "rope_theta": 500000.0},
    "qwen3-32b": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128,
                  "hidden_size": 5120, "intermediate_size": 25600, "num_attention_heads": 64,
                  "num_hidden_layers": 64, "num_key_value_heads": 8, "vocab_size": 151936,
                  "tie_word_embeddings": False},
    "qwen3-30b-a3b": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                      "decoder_sparse_step": 1, "head_dim": 128, "hidden_size": 2048,
                      "intermediate_size": 6144, "mlp_only_layers": [], "moe_intermediate_size": 768,
                      "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
                      "num_hidden_layers": 48, "num_key_value_heads": 4, "vocab_size": 151936,
                      "tie_word_embeddings": False},
    "llama4-scout": {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                     "text_config": {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                                     "intermediate_size_mlp": 16384, "num_attention_heads": 40,
                                     "num_hidden_layers": 48, "num_key_value_heads": 8, "head_dim": 128,
                                     "num_local_experts": 16, "num_experts_per_tok": 1,
                                     "interleave_moe_layer_step": 1, "vocab_size": 202048},
                     "vision_config": {"hidden_size": 1408}, "tie_word_embeddings": False},
}


@pytest.mark.parametrize("name", sorted(HF))
def test_hf_import_matches_catalog(name, write_json):
    card = load_model(str(write_json(HF[name], name + ".json")))
    ref = catalog()[name]
    assert card.params == ref.params
    assert card.active_params == ref.active_params
    assert card.name == name  # the folder holding config.json names the model


def test_hf_import_tied_embeddings(write_json):
    # Qwen3-0.6B: 0.6B total, 0.44B without embeddings, tied embeddings.
    cfg = dict(HF["qwen3-32b"], hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
               num_hidden_layers=28, tie_word_embeddings=True)
    card = load_model(str(write_json(cfg)))
    assert round(card.params / 1e9, 3) == 0.596
    assert round((card.params - card.embedding_params) / 1e9, 2) == 0.44


def test_hf_import_llama4_maverick_interleaved(write_json):
    # Maverick interleaves MoE layers every second layer; dense layers use intermediate_size_mlp.
    text = dict(HF["llama4-scout"]["text_config"], num_local_experts=128, interleave_moe_layer_step=2)
    card = load_model(str(write_json(dict(HF["llama4-scout"], text_config=text))))
    assert card.moe_layer_count == 24
    assert not card.is_moe_layer(0) and card.is_moe_layer(1)
    assert round(card.active_params / 1e9, 1) == 17.2  # "17B active" like Scout


# Llama's shape under other names, their published config.json (mistralai/Mistral-7B-v0.1,
# Qwen/Qwen2-7B) and published totals (7.24B; 7.62B, Qwen2's q/k/v biases included)
LLAMA_SHAPED = [
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
      "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
      "vocab_size": 32000, "sliding_window": 4096, "tie_word_embeddings": False, "rope_theta": 10000.0}, 7.24e9),
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
      "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
      "vocab_size": 152064, "max_window_layers": 28, "use_sliding_window": False, "tie_word_embeddings": False,
      "rope_theta": 1000000.0}, 7.62e9),
]


@pytest.mark.parametrize("cfg,published", LLAMA_SHAPED, ids=["mistral-7b", "qwen2-7b"])
def test_hf_import_llama_shaped_under_other_names(cfg, published, write_json, cli):
    card = load_model(str(write_json(cfg)))
    assert abs(card.params - published) / published < 0.01
    assert card.active_params == card.params and card.moe is None
    rc, out, err = cli("plan", "--model", str(write_json(cfg, "m.json")))
    assert rc == 0 and out.startswith(f"m: {published / 1e9:.2f} B parameters"), err


def test_hf_import_directory(write_json):
    path = write_json(HF["llama3-8b"], "my-llama.json")
    assert load_model(str(path.parent)).params == catalog()["llama3-8b"].params


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}', "unsupported architecture"),
    ('{"architectures": ["MistralForCausalLM"], "model_type": "mistral"}', "lacks 'hidden_size'"),
    ('{"model_type": "mistral", "num_local_experts": 8}', "is not Llama-shaped"),
    ('{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}', "lacks"),
    ('{"architectures": ["LlamaForCausalLM"], "hidden_size": "big", "num_attention_heads": 32,'
     ' "num_hidden_layers": 2, "vocab_size": 10, "intermediate_size": 5}',
     "hidden_size must be an integer from 1"),
    ("[1, 2]", "expected a JSON object"),
])
def test_bad_hf_configs(content, needle, write_json):
    with pytest.raises(UsageError, match=needle):
        load_model(str(write_json(content)))


def test_unreadable_config(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        load_model(str(tmp_path / "missing" / "config.json"))


def test_unknown_model_lists_known():
    with pytest.raises(UsageError) as e:
        load_model("llama9-1t")
    for name in catalog():
        assert name in str(e.value)


def test_custom_card_file():
    card = load_model(str(ROOT / "examples" / "model-card.toml"))
    assert card.name == "llama3-1b-example"
    assert round(card.params / 1e9, 2) == 1.24  # Llama-3.2-1B: 1.24B with tied embeddings


def test_invalid_card(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[arch]\nhidden = 1\n')
    with pytest.raises(UsageError, match="not a valid model card"):
        load_model(str(bad))
    bad.write_text("name = ")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_model(str(bad))
