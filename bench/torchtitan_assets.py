"""Local assets for TorchTitan's llama3 debug model, so that it trains with no downloads:
a word-level tokenizer (tokenizer.json + tokenizer_config.json, 2000 words and the Llama 3
special tokens, inside the debug model's 2048-entry vocabulary) and a seeded synthetic
text dataset in the shape of TorchTitan's c4_test (JSON lines with a "text" field).

    python3 bench/torchtitan_assets.py DIR   # writes DIR/tokenizer/ and DIR/c4_synthetic/
"""

import json
import random
import sys
from pathlib import Path

WORDS = 2000
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {BOS: 0, EOS: 1, "[UNK]": 2}
    vocab.update({f"w{i}": i + 3 for i in range(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True,
         "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=1))


def write_dataset(out: Path, docs: int = 4000, seed: int = 0) -> None:
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "data.json", "w") as f:
        for _ in range(docs):
            n = rng.randint(200, 1200)
            # Zipf-like word frequencies, as in text
            words = (f"w{min(int(rng.paretovariate(1.1)) - 1, WORDS - 1)}" for _ in range(n))
            f.write(json.dumps({"text": " ".join(words)}) + "\n")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    root = Path(sys.argv[1])
    write_tokenizer(root / "tokenizer")
    write_dataset(root / "c4_synthetic")
    print(f"wrote {root / 'tokenizer'} and {root / 'c4_synthetic'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
