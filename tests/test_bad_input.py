"""Every bad input a new user met (issue 15) and more found the same way, one row each.

Each row runs the CLI in a process of its own (forked from a server that imported it
once, tests/forkcli.py; the rows of the issue itself also as `python -m transit_launch`)
and must give exit code 2, nothing on stdout, exactly one line on stderr starting
"transit-launch: error: " (with the row's needle in it), no traceback, nothing written,
and an answer within seconds. Inputs refer to files of FILES by {d}/NAME; {d} is a fresh
directory that must hold the same files afterwards.

Trace rows that cannot be read are not errors: they are dropped and counted
(test_unreadable_trace_rows_are_counted, at the end)."""

import json
import os
import stat

import pytest

from tests.conftest import run_cli
from tests.forkcli import ForkCLI
from transit_launch.planning.memory import PRECISIONS

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
         "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256}
QWEN_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
            "num_hidden_layers": 48, "num_key_value_heads": 4, "vocab_size": 151936}
CARD = ('name = "c"\n[arch]\nhidden = 2048\nlayers = 16\nheads = 32\nkv_heads = 8\nhead_dim = 64\nffn = 8192\n'
        'vocab = 128256\n')


def hf(**change):
    return json.dumps({k: v for k, v in {**LLAMA, **change}.items() if v is not None})


def card(old="", new=""):
    return CARD.replace(old, new) if old else CARD + new


HEAD = "submit_time,duration,gpus\n"
FAIL = "#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"
FILES = {
    # Hugging Face config.json
    "heads0.json": hf(num_attention_heads=0),
    "archlist.json": hf(architectures=[["LlamaForCausalLM"]]),
    "arch5.json": hf(architectures=5),
    "typelist.json": json.dumps({"model_type": ["llama"], "hidden_size": 8}),
    "neghidden.json": hf(hidden_size=-4096),
    "strhidden.json": hf(hidden_size="4096"),
    "floathidden.json": hf(hidden_size=4096.5),
    "boolhidden.json": hf(hidden_size=True),
    "infhidden.json": hf(hidden_size=None)[:-1] + ', "hidden_size": 1e400}',
    "nanhidden.json": hf(hidden_size=None)[:-1] + ', "hidden_size": NaN}',
    "hugelayers.json": hf(num_hidden_layers=10**12),
    "novocab.json": hf(vocab_size=None),
    "kv7.json": hf(num_key_value_heads=7),
    "tieyes.json": hf(tie_word_embeddings="yes"),
    "topk.json": json.dumps({**QWEN_MOE, "num_experts_per_tok": 200}),
    "mlponly.json": json.dumps({**QWEN_MOE, "mlp_only_layers": ["a"]}),
    "textcfg.json": json.dumps({"architectures": ["Llama4ForCausalLM"], "text_config": "big"}),
    "binary.json": b"\xff\xfe{}",
    "empty.json": "",
    "null.json": "null",
    "list.json": "[1, 2]",
    "nodir/placeholder": "",
    # model cards
    "strhidden.toml": card("hidden = 2048", 'hidden = "2048"'),
    "layers0.toml": card("layers = 16", "layers = 0"),
    "negffn.toml": card("ffn = 8192", "ffn = -1"),
    "typo.toml": card("hidden = 2048", "hiden = 2048"),
    "archstr.toml": 'name = "c"\narch = "x"\n',
    "noarch.toml": 'name = "c"\n',
    "noname.toml": CARD.replace('name = "c"\n', ""),
    "name5.toml": card('name = "c"', "name = 5"),
    "topk0.toml": card(new="[moe]\nexperts = 8\ntop_k = 0\nexpert_ffn = 64\n"),
    "pubstr.toml": card('name = "c"', 'name = "c"\npublished_params = "big"'),
    "broken.toml": "name = ",
    "binary.toml": b"name = \"\xff\"\n",
    "dir.toml/placeholder": "",
    "gpt2.toml": card('name = "c"', 'name = "c"\nfamily = "gpt2"'),
    "pub5x.toml": card('name = "c"', 'name = "c"\npublished_params = 7.5e9'),  # [arch] gives 1.50B
    "titan.d/placeholder": "",
    # traces
    "empty.csv": "",
    "header.csv": HEAD,
    "allbad.csv": HEAD + "nan,100,8\n0,inf,8\n0,100,inf\n",
    "binary.csv": b"\xff\xfe\x00\x01\n",
    "columns.csv": "a,b\n1,2\n",
    "big.csv": HEAD + "0,100,600\n",
    "file": "x",
    "bin/sinfo": FAIL,
}

D = "{d}"
PLAN = ["plan", "--model", "llama3-70b"]
RENDER = ["render", "--model", "llama3-70b"]
CMD = ["--", "python", "train.py"]
SYN = ["simulate", "--synthetic", "100"]
SUBMIT = ["submit", "--model", "llama3-70b", "--dry-run"]
BW, BW_END = ["sweep", "--cap", "mlnx_qos", "--iface", "lo", "--bandwidths"], ["--journal", f"{D}/j.json", "--", "true"]

ROWS = [
    # --- model: catalog names, Hugging Face config.json, model cards --------------------
    (["plan", "--model", "gpt-5"], "unknown model 'gpt-5'; known: llama3-405b"),
    (["plan", "--model", ""], "--model needs a catalog name or a file"),
    (["plan", "--model", "/nonexistent/config.json"], "cannot read /nonexistent/config.json"),
    (["plan", "--model", f"{D}/nodir"], "nodir/config.json: No such file"),
    (["plan", "--model", f"{D}/heads0.json"], "num_attention_heads must be an integer from 1"),
    (["plan", "--model", f"{D}/archlist.json"], "unsupported architecture [['LlamaForCausalLM']]"),
    (["plan", "--model", f"{D}/arch5.json"], "architectures must be a list of names, got 5"),
    (["plan", "--model", f"{D}/typelist.json"], "unsupported architecture"),
    (["plan", "--model", f"{D}/neghidden.json"], "hidden_size must be an integer from 1 to 1048576, got -4096"),
    (["plan", "--model", f"{D}/strhidden.json"], "hidden_size must be an integer from 1 to 1048576, got '4096'"),
    (["plan", "--model", f"{D}/floathidden.json"], "got 4096.5"),
    (["plan", "--model", f"{D}/boolhidden.json"], "got True"),
    (["plan", "--model", f"{D}/infhidden.json"], "got inf"),
    (["plan", "--model", f"{D}/nanhidden.json"], "got nan"),
    (["plan", "--model", f"{D}/hugelayers.json"], "num_hidden_layers must be an integer from 1 to 1024"),
    (["plan", "--model", f"{D}/novocab.json"], "lacks 'vocab_size'"),
    (["plan", "--model", f"{D}/kv7.json"], "kv_heads=7 does not divide heads=32"),
    (["plan", "--model", f"{D}/tieyes.json"], "tie_word_embeddings must be true or false, got 'yes'"),
    (["plan", "--model", f"{D}/topk.json"], "top_k=200 exceeds the 128 experts"),
    (["plan", "--model", f"{D}/mlponly.json"], "mlp_only_layers must be a list of layer indices"),
    (["plan", "--model", f"{D}/textcfg.json"], "text_config must be an object"),
    (["plan", "--model", f"{D}/binary.json"], "is not UTF-8 text"),
    (["plan", "--model", f"{D}/empty.json"], "is not valid JSON"),
    (["plan", "--model", f"{D}/null.json"], "expected a JSON object"),
    (["plan", "--model", f"{D}/list.json"], "expected a JSON object"),
    (["plan", "--model", f"{D}/strhidden.toml"], "hidden must be an integer from 1 to 1048576, got '2048'"),
    (["plan", "--model", f"{D}/layers0.toml"], "layers must be an integer from 1 to 1024, got 0"),
    (["plan", "--model", f"{D}/negffn.toml"], "ffn must be an integer"),
    (["plan", "--model", f"{D}/typo.toml"], "unknown key 'hiden' in [arch]"),
    (["plan", "--model", f"{D}/archstr.toml"], "[arch] must be a table"),
    (["plan", "--model", f"{D}/noarch.toml"], "lacks the [arch] table"),
    (["plan", "--model", f"{D}/noname.toml"], "lacks 'name'"),
    (["plan", "--model", f"{D}/name5.toml"], "name must be a non-empty string"),
    (["plan", "--model", f"{D}/topk0.toml"], "top_k must be an integer from 1"),
    (["plan", "--model", f"{D}/pubstr.toml"], "published_params must be a positive number"),
    (["plan", "--model", f"{D}/broken.toml"], "is not valid TOML"),
    (["plan", "--model", f"{D}/binary.toml"], "is not UTF-8 text"),
    (["plan", "--model", f"{D}/dir.toml"], "Is a directory"),
    # issue 51: a family the formulas do not describe; a published count 5x off its dimensions
    (["plan", "--model", f"{D}/gpt2.toml"], "family 'gpt2' is not one the planner can cost"),
    (["plan", "--model", f"{D}/pub5x.toml"],
     "published_params 7.5e+09 and the [arch] numbers (1,498,482,688 parameters, 0.2x) disagree"),
    # a path below a file (ENOTDIR), a directory where a file goes
    (["plan", "--model", f"{D}/file/x"], f"cannot read {D}/file/x: Not a directory"),
    (["plan", "--torchtitan", f"{D}/titan.d"], "titan.d is a directory; give the job's .toml file"),
    (["plan", "--model", f"{D}/missing.toml"], "No such file"),
    (["plan", "--model", f"{D}/two\nlines\x1b[31m.toml"], "two lines\\x1b[31m.toml: No such file"),
    # --- plan: sizes, degrees, batches, hardware ------------------------------------------
    ([*PLAN, "--gpu-mem", "eighty"], "--gpu-mem: cannot parse 'eighty'"),
    ([*PLAN, "--gpu-mem", "-5GB"], "--gpu-mem: '-5GB' is negative: a size is at least one byte"),
    ([*PLAN, "--gpu-mem", "0.5"], "'0.5' has no unit"),
    ([*PLAN, "--gpu-mem", "0.5B"], "'0.5B' must be at least one byte"),
    ([*PLAN, "--gpu-mem", "1KB"], "GPU memory (--gpu-mem) must be from 1GiB"),
    ([*PLAN, "--gpu-mem", "1e9"], "cannot parse '1e9'"),
    ([*PLAN, "--gpu-mem", "inf"], "cannot parse 'inf'"),
    ([*PLAN, "--gpu-mem", "2000TB"], "larger than 1 PiB"),
    ([*PLAN, "--host-mem", "12XB"], "--host-mem: cannot parse"),
    ([*PLAN, "--host-mem", "0GB"], "must be at least one byte"),
    ([*PLAN, "--host-mem", "1KB"], "--host-mem must be at least 1GiB"),
    ([*PLAN, "--gpu", "tpu-v5"], "unknown GPU 'tpu-v5'"),
    ([*PLAN, "--gpu", ""], "unknown GPU ''"),
    ([*PLAN, "--tp", "3"], "does not divide"),
    ([*PLAN, "--tp", "0"], "argument --tp: must be a positive integer"),
    ([*PLAN, "--parallel", "tp+pp", "--pp", "3", "--local-batch", "4"], "pp=3 does not divide llama3-70b's 80 layers"),
    (["plan", "--model", "qwen3-30b-a3b", "--ep", "3"], "ep=3 does not divide qwen3-30b-a3b's 128 experts"),
    ([*PLAN, "--tp", "8", "--gpus-per-node", "6"], "neither divides"),
    ([*PLAN, "--parallel", "fsdp+ep"], "needs an MoE model"),
    ([*PLAN, "--global-batch", "7"], "serves global batch 7"),
    ([*PLAN, "--global-batch", "0"], "argument --global-batch: must be a positive integer"),
    ([*PLAN, "--seq-len", "-5"], "argument --seq-len: must be a positive integer"),
    ([*PLAN, "--seq-len", "1.5"], "argument --seq-len: must be a positive integer, got '1.5'"),
    ([*PLAN, "--seq-len", "nan"], "argument --seq-len: must be a positive integer, got 'nan'"),
    ([*PLAN, "--local-batch", "0"], "argument --local-batch: must be a positive integer"),
    ([*PLAN, "--gpus-per-node", "0"], "argument --gpus-per-node: must be a positive integer"),
    ([*PLAN, "--gpus-per-node", "1000"], "no node has more than 64 GPUs"),
    ([*PLAN, "--scale-in", "1.5"], "strictly between 0 and 1"),
    ([*PLAN, "--scale-in", "nan"], "strictly between 0 and 1"),
    ([*PLAN, "--scale-in", ","], "strictly between 0 and 1"),
    ([*PLAN, "--min-efficiency", "0"], "--min-efficiency must lie in (0, 1]"),
    ([*PLAN, "--min-efficiency", "1.5"], "--min-efficiency must lie in (0, 1]"),
    ([*PLAN, "--min-efficiency", "nan"], "must be a finite number, got 'nan'"),
    ([*PLAN, "--min-efficiency", "-inf"], "must be a finite number, got '-inf'"),
    ([*PLAN, "--precision", "fp4"], "invalid choice"),
    # the choices are memory.PRECISIONS, fp32 among them
    ([*PLAN, "--precision", "fp16"], f"invalid choice: 'fp16' (choose from {', '.join(map(repr, PRECISIONS))})"),
    (["plan"], "the following arguments are required: --model"),
    ([*PLAN, *CMD], "plan takes no command"),
    # nothing fits, not even with offloading: the advice must be the right one
    # (TorchTitan runs tp+pp in fp32: the planner estimates fp32, hence 8 nodes)
    ([*PLAN, "--parallel", "tp+pp"], "tp+pp needs a local batch of at least pp (one microbatch per stage): "
                                     "with --local-batch 8, 8 nodes fit without offloading"),
    (["plan", "--model", "llama4-scout", "--parallel", "fsdp+ep", "--local-batch", "4"],
     "not even with offloading"),
    ([*PLAN, "--global-batch", "16", "--host-mem", "40GB"], "host DRAM is too small"),
    # --- output paths: refused before the work -----------------------------------------------
    ([*PLAN, "--plot", D], "is a directory; give a file name ending in .png"),
    ([*PLAN, "--plot", f"{D}/no/x.png"], "does not exist"),
    ([*PLAN, "--plot", f"{D}/x.jpg"], "must end in .png"),
    ([*PLAN, "--plot", "/proc/x.png"], "cannot create files in /proc"),
    ([*PLAN, "--plot", ""], "the file name is empty"),
    ([*PLAN, "--plot", f"{D}/file/x.png"], f"{D}/file is not a directory"),
    # --- render ------------------------------------------------------------------------------
    (RENDER, "render needs the training command"),
    (["render", *CMD], "render needs --model"),
    ([*RENDER, "-o", "/nonexistent/dir/x", *CMD], "directory /nonexistent/dir does not exist"),
    ([*RENDER, "-o", D, *CMD], "is a directory; give a file name"),
    ([*RENDER, "-o", "/proc/nope", *CMD], "cannot create files in /proc"),
    ([*RENDER, "-o", f"{D}/file/x", *CMD], f"{D}/file is not a directory"),
    ([*RENDER, "--port", "99999", *CMD], "--port: must be a TCP port from 1 to 65535"),
    ([*RENDER, "--port", "0", *CMD], "argument --port: must be a TCP port from 1 to 65535"),
    ([*RENDER, "--port", "-1", *CMD], "argument --port: must be a TCP port from 1 to 65535"),
    ([*RENDER, "--time", "forever", *CMD], "--time 'forever' is not a Slurm time limit"),
    ([*RENDER, "--time", "1:2:3:4", *CMD], "is not a Slurm time limit"),
    ([*RENDER, "--partition", "", *CMD], "--partition is empty"),
    ([*RENDER, "--output", " ", *CMD], "--output is empty"),
    ([*RENDER, "--nodes", "0", *CMD], "argument --nodes: must be a positive integer"),
    ([*RENDER, "--nodes", "abc", *CMD], "argument --nodes: must be a positive integer"),
    ([*RENDER, "--nodes", "1000000", *CMD], "argument --nodes: must be a positive integer of at most 100000"),
    ([*RENDER, "--gpu-budget", "0GB", *CMD], "must be at least one byte"),
    ([*RENDER, "--policy", "turbo", *CMD], "invalid choice"),
    ([*RENDER, "--log", "chatty", *CMD], "invalid choice"),
    # a retired step mode is named as retired, with the modes there are (docs/retired-experiments.md)
    ([*RENDER, "--overlap", "serial", *CMD],
     "argument --overlap: 'serial' is retired (docs/retired-experiments.md): the modes are 0, stream, host"),
    (["run", "--overlap", "1", "--", "true"],
     "argument --overlap: '1' is retired (docs/retired-experiments.md): the modes are 0, stream, host"),
    ([*RENDER, "--overlap", "staged", *CMD], "argument --overlap: 'staged' is retired"),
    ([*PLAN, "--overlap", "staged"], "argument --overlap: 'staged' is retired"),
    (["run", "--overlap", "serial", "--", "true"], "argument --overlap: 'serial' is retired"),
    ([*PLAN, "--overlap", "serial"], "argument --overlap: 'serial' is retired"),
    ([*SUBMIT, "--overlap", "serial", *CMD], "argument --overlap: 'serial' is retired"),
    # --- submit ------------------------------------------------------------------------------
    ([*SUBMIT, "--nodes", "0", *CMD], "argument --nodes: must be auto or a positive integer of at most 100000, got '0'"),
    ([*SUBMIT, "--nodes", "-3", *CMD], "got '-3'"),
    ([*SUBMIT, "--nodes", "lots", *CMD], "got 'lots'"),
    ([*SUBMIT, "--nodes", "1e3", *CMD], "got '1e3'"),
    (SUBMIT, "submit needs the training command"),
    (["submit", "--dry-run", *CMD], "the following arguments are required: --model"),
    (["submit", "--model", "llama3-70b", *CMD], "sinfo failed: sinfo: error: Unable to contact slurm controller"),
    # --- issue 28: a bare number is no size; a budget fits the GPU; options that did nothing --
    ([*PLAN, "--gpu-mem", "80"], "'80' has no unit: a size needs one (e.g. 80GB, 80GiB, or 80B for bytes)"),
    ([*PLAN, "--host-mem", "512"], "'512' has no unit"),
    ([*RENDER, "--gpu-budget", "70", *CMD], "--gpu-budget: '70' has no unit"),
    (["run", "--gpu-budget", "70", "--", "true"], "--gpu-budget: '70' has no unit"),
    ([*RENDER, "--gpu-budget", "100MB", *CMD], "'100MB' is below 512MiB, the least GPU budget"),
    ([*RENDER, "--policy", "advise", "--gpu-budget", "100GB", *CMD],
     "--gpu-budget 100GB is more than the GPU has: h100-80gb has 85.52 GB"),
    (["render", "--nodes", "1", "--gpu", "a100-40gb", "--policy", "advise", "--gpu-budget", "41GiB", *CMD],
     "a100-40gb has 42.95 GB"),
    ([*RENDER, "--gpu-mem", "40GB", "--policy", "advise", "--gpu-budget", "41GB", *CMD],
     "--gpu-mem 40GB and --gpu-budget 41GB differ"),
    ([*RENDER, "--policy", "off", "--gpu-budget", "40GB", *CMD], "--gpu-budget 40GB needs a shim policy other than off"),
    (["run", "--policy", "off", "--gpu-budget", "40GB", "--", "true"], "needs a shim policy other than off"),
    ([*PLAN, "--gpu-mem", "1.5PiB"], "'1.5PiB' is larger than 1 PiB"),
    ([*PLAN, "--measure-layers", "2"], "--measure-layers 2 sets the depth --measure runs at; add --measure"),
    ([*RENDER, "--local", "--partition", "gpu", *CMD], "--partition is for sbatch (leave out --local)"),
    ([*RENDER, "--local", "--time", "10", "--port", "1234", *CMD], "--time, --port are for sbatch"),
    ([*RENDER, "--stats", "", *CMD], "--stats: the stats path is empty"),
    (["run", "--stats", " ", "--", "true"], "--stats: the stats path is empty"),
    (["sweep", "--restore", "--bandwidths", "100"], "--bandwidths would do nothing with it"),
    (["sweep", "--restore", "--journal", f"{D}/j.json", "--cap", "tc", "--", "true"],
     "--cap, a command after -- would do nothing with it"),
    (["sweep", "--cap", "tc", "--iface", "lo", "--bandwidths", "100", "--journal", f"{D}/j.json", "--",
      "/nonexistent/cmd"], "cannot start '/nonexistent/cmd': no such program"),
    (["sweep", "--cap", "tc", "--iface", "lo", "--bandwidths", "100", "--journal", f"{D}/j.json", "--", D],
     "no such program (or not executable)"),
    (["sweep", "--cap", "tc", "--iface", "lo", "--bandwidths", "100", "--journal", f"{D}/no/j.json", "--", "true"],
     f"journal directory {D}/no does not exist"),
    (["sweep", "--cap", "tc", "--iface", "lo", "--bandwidths", "100", "--plot", f"{D}/x.jpg", "--", "true"],
     "must end in .png"),
    # bytes are not bits: tc's mbps is megabytes a second (mlnx_qos: a regression touches no NIC here)
    ([*BW, "100MBps", *BW_END],
     ("bandwidth '100MBps': bandwidths are bits a second, and 'Bps' reads as bytes (tc's mbps is megabytes a second): "
      "800Mbit is 100 MB/s, 100Mbit is 100 Mbit/s")),
    ([*BW, "1gbps", *BW_END], "8Gbit is 1 GB/s, 1Gbit is 1 Gbit/s"),
    ([*BW, "100MB/s", *BW_END], "'B/s' reads as bytes"),
    (["plan", "--modle", "llama3-70b"], "unrecognized arguments: --modle llama3-70b (did you mean --model?)"),
    (["render", "--nodes", "1", "--partiton", "gpu", *CMD], "unrecognized arguments: --partiton gpu (did you mean"),
    # --- simulate ----------------------------------------------------------------------------
    (["simulate"], "exactly one of --trace FILE or --synthetic N"),
    ([*SYN, "--trace", f"{D}/header.csv"], "exactly one of"),
    (["simulate", "--trace", "/nonexistent.csv"], "cannot read trace /nonexistent.csv"),
    (["simulate", "--trace", D], "Is a directory"),
    (["simulate", "--trace", f"{D}/empty.csv"], "is empty"),
    (["simulate", "--trace", f"{D}/header.csv"], "no jobs left after filtering"),
    (["simulate", "--trace", f"{D}/allbad.csv"], "no jobs left after filtering; dropped: 1 unparsable GPU count, "
                                                 "1 unparsable submit time, 1 zero or negative duration"),
    (["simulate", "--trace", f"{D}/binary.csv"], "unrecognised trace columns"),
    (["simulate", "--trace", f"{D}/columns.csv"], "unrecognised trace columns"),
    (["simulate", "--trace", f"{D}/header.csv", "--format", "seren"], "has the generic column set, not seren"),
    (["simulate", "--trace", f"{D}/big.csv", "--racks", "1"], "1 job(s) ask for more GPUs (up to 600)"),
    (["simulate", "--synthetic", "0"], "argument --synthetic: must be a positive integer"),
    (["simulate", "--synthetic", "-5"], "argument --synthetic: must be a positive integer"),
    (["simulate", "--synthetic", "1e6"], "argument --synthetic: must be a positive integer"),
    (["simulate", "--synthetic", "99999999999"], "--synthetic takes 1 to 10,000,000 jobs"),
    ([*SYN, "--load", "0"], "--load must lie in (0, 10]"),
    ([*SYN, "--load", "-1"], "--load must lie in (0, 10]"),
    ([*SYN, "--load", "11"], "--load must lie in (0, 10]"),
    ([*SYN, "--load", "nan"], "argument --load: must be a finite number, got 'nan'"),
    ([*SYN, "--load", "inf"], "got 'inf'"),
    ([*SYN, "--median-duration", "0"], "--median-duration must lie in [1, 604800] seconds"),
    ([*SYN, "--median-duration", "-5"], "--median-duration must lie in [1, 604800] seconds"),
    ([*SYN, "--median-duration", "1e9"], "--median-duration must lie in [1, 604800] seconds"),
    ([*SYN, "--median-duration", "nan"], "got 'nan'"),
    ([*SYN, "--unchanged", "-1"], "--unchanged must lie in [-0.99, 10]"),
    ([*SYN, "--unchanged", "-2"], "--unchanged must lie in [-0.99, 10]"),
    ([*SYN, "--unchanged", "nan"], "got 'nan'"),
    ([*SYN, "--speedup", "nan"], "got 'nan'"),
    ([*SYN, "--speedup", "-0.5"], "--speedup must lie in [0, 10]"),
    ([*SYN, "--speedup", "1e308"], "--speedup must lie in [0, 10]"),
    ([*SYN, "--slowdown", "-1"], "--slowdown must lie in [0, 10]"),
    ([*SYN, "--racks", "1000000"], "--racks takes 1 to 10,000 racks"),
    ([*SYN, "--racks", "0"], "argument --racks: must be a positive integer"),
    ([*SYN, "--reduced-racks", "20000"], "--racks takes 1 to 10,000 racks"),
    ([*SYN, "--racks", "4", "--reduced-racks", "8"], "--reduced-racks 8 must be fewer than --racks 4"),
    ([*SYN, "--racks", "4", "--reduced-racks", "4"], "--reduced-racks 4 must be fewer than --racks 4"),
    ([*SYN, "--rack-gpus", "30"], "--rack-gpus 30 is not a multiple of --gpus-per-node 4"),
    ([*SYN, "--rack-gpus", "100000"], "--rack-gpus takes 1 to 1024 GPUs a rack"),
    ([*SYN, "--gpus-per-node", "6"], "invalid choice"),
    ([*SYN, "--reductions", "1.5"], "reductions must lie in [0, 1)"),
    ([*SYN, "--reductions", "abc"], "--reductions takes fractions"),
    ([*SYN, "--seed", "abc"], "invalid int value"),
    ([*SYN, "--plot", D], "is a directory; give a file name ending in .png"),
    ([*SYN, "--plot", f"{D}/no/x.png"], "does not exist"),
    ([*SYN, "--plot", f"{D}/x.jpg"], "must end in .png"),
    ([*SYN, "--plot", "/proc/x.png"], "cannot create files in /proc"),
    # --- run, spank, the rest ------------------------------------------------------------------
    (["run"], "run needs the command after --"),
    (["run", "--stats", "/proc/nope", "--", "true"], "--stats /proc/nope: cannot create the directory"),
    (["run", "--stats", f"{D}/file", "--", "true"], "is a file; run writes one stats file per process"),
    (["run", "--", "no-such-program-xyz"], "cannot start 'no-such-program-xyz': no such program"),
    (["run", "--gpu-budget", "1e30", "--", "true"], "cannot parse '1e30'"),
    (["run", "--policy", "bogus", "--", "true"], "invalid choice"),
    (["spank", "build", "--out", "/proc/nope"], "cannot create files in /proc"),
    (["spank", "build", "--out", f"{D}/file"], "exists and is not a directory"),
    (["spank", "build", "--out", f"{D}/file/x"], f"{D}/file is not a directory"),
    (["sweep", "--restore", "--journal", f"{D}/titan.d"], "restore journal {d}/titan.d is not a regular file"),
    (["doctor", "--bogus"], "unrecognized arguments: --bogus"),
    (["frobnicate"], "invalid choice"),
    (["status", "12;rm -rf"], "'12;rm -rf' is not a Slurm job id"),
    (["cancel", "all"], "'all' is not a Slurm job id"),
    # --- issue 51's last newcomer trial: absurd sizes, a missing interface or parent, job ids, digits
    ([*PLAN, "--gpu-mem", "999TB"], "GPU memory (--gpu-mem) must be from 1GiB to 1TiB"),
    ([*PLAN, "--host-mem", "999TB"], "--host-mem 999TB is more than any node has: host DRAM per node must be at "
                                     "most 64TiB"),
    (["netcap", "counters", "--cap", "tc", "--iface", "nosuchif0"],
     "--iface nosuchif0: no such network interface on this node"),
    (["spank", "build", "--out", f"{D}/missing/x"], f"{D}/missing/x: directory {D}/missing does not exist"),
    (["status", "--", "-1"], "'-1' is not a Slurm job id (a positive integer, or an array task such as 123_4)"),
    (["cancel", "--", "-1"], "'-1' is not a Slurm job id"),
    (["status", "0"], "'0' is not a Slurm job id"),
    (["status", "\uff13"], "'\uff13' is not a Slurm job id"),
    (["status"], "status takes one job id, got none"),
    ([*RENDER, "--nodes", "\uff13", *CMD], "--nodes: must be a positive integer of at most 100000 in ASCII digits"),
    ([*SUBMIT, "--nodes", "\uff13", *CMD], "--nodes: must be auto or a positive integer of at most 100000 in ASCII"),
    ([*PLAN, "--seq-len", "\uff18192"], "--seq-len: must be a positive integer in ASCII digits, got '\uff18192'"),
    ([*PLAN, "--scale-in", "\uff10.5"], "--scale-in takes fractions like 0.25,0.5"),
    ([*RENDER, "--local", "--on-node-loss", "scale-in", *CMD], "--on-node-loss scale-in is for sbatch jobs"),
    ([*RENDER, "--time", "\uff130", *CMD], "--time '\uff130' is not a Slurm time limit"),
    ([*RENDER, "--mem", "\uff18G", *CMD], "--mem '\uff18G' is not sbatch's memory size"),
    (["sweep", "--restore", "--journal", f"{D}/missing/j.json"],
     f"--journal {D}/missing/j.json: directory {D}/missing does not exist, so no sweep left a journal there"),
]


def _tree(d):
    return sorted((str(p.relative_to(d)), p.stat().st_size if p.is_file() else -1) for p in d.rglob("*"))


@pytest.fixture(scope="module")
def forked():
    server = ForkCLI()
    yield server.run
    server.close()


@pytest.fixture
def files(tmp_path):
    for name, content in FILES.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/placeholder"):
            continue  # the directory alone
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    (tmp_path / "bin" / "sinfo").chmod(stat.S_IRWXU)
    return tmp_path


def check_row(run, files, args, needle):
    before = _tree(files)
    env = {"PATH": f"{files / 'bin'}{os.pathsep}{os.environ['PATH']}"}  # a Slurm whose controller is down
    # a hang is the run's timeout (rc 'timeout'), not a wall-clock bound here
    rc, out, err = run(*[a.replace(D, str(files)) for a in args], env=env)[:3]
    lines = err.splitlines()
    assert "Traceback" not in err, err
    assert rc == 2, (rc, err)
    assert out == ""
    assert len(lines) == 1 and lines[0].startswith("transit-launch: error: "), err
    assert needle.replace(D, str(files)) in lines[0]
    assert _tree(files) == before  # nothing written, not even a partial file


@pytest.mark.parametrize("args,needle", ROWS, ids=[f"{i:03d} " + " ".join(a)[:60] for i, (a, _) in enumerate(ROWS)])
def test_one_line_exit_2(forked, files, args, needle):
    check_row(lambda *a, env: forked(*a, env=env, cwd=files, timeout=20), files, args, needle)


ISSUE = ["heads0.json", "archlist.json", "strhidden.toml", "layers0.toml", "neghidden.json", "/nonexistent/dir/x",
         "-o {d}", "allbad.csv", "--load 0", "--unchanged -1", "--median-duration 0", "--median-duration nan",
         "{d}/no/x.png", "spank build --out /proc/nope", "run --stats /proc/nope", "--load nan", "--speedup nan",
         "--unchanged nan", "--unchanged -2", "--load inf", "--port 99999", "--time forever", "--plot {d}",
         "--racks 1000000", "--synthetic 99999999999", "--gpu-mem 0.5", "--gpu-mem 1KB", "--gpu-mem -5GB",
         "--model  ", "--nodes 0"]
ISSUE_ROWS = [next(r for r in ROWS if case in " ".join(r[0]) + " ") for case in ISSUE]
# issue 28's, the same way
ISSUE_28 = ["--gpu-mem 80", "render --model llama3-70b --gpu-budget 70", "run --gpu-budget 70",
            "--measure-layers 2", "sweep --restore --bandwidths 100", "--local --partition gpu", "--stats  ",
            "/nonexistent/cmd", "{d}/no/j.json", "--gpu-mem 1.5PiB", "--modle"]
ISSUE_ROWS += [next(r for r in ROWS if case in " ".join(r[0]) + " ") for case in ISSUE_28]
ISSUE += ISSUE_28


@pytest.mark.parametrize("args,needle", ISSUE_ROWS, ids=ISSUE)
def test_issue_rows_as_python_m_transit_launch(files, args, needle):
    """The issue's own rows (finding each guards against losing one while editing), run the
    way users run the CLI: a fresh interpreter each."""
    check_row(lambda *a, env: run_cli(*a, env=env, timeout=30), files, args, needle)


# --- trace rows that cannot be read: counted, never a crash --------------------------------

UNREADABLE = [
    ("0,100,inf", "unparsable GPU count"),
    ("0,100,nan", "unparsable GPU count"),
    ("0,100,2.5", "unparsable GPU count"),
    ("0,100,\xff8", "unparsable GPU count"),  # written as latin-1: a byte that is not UTF-8
    ("0,100,-1", "not a GPU job"),
    ("nan,100,8", "unparsable submit time"),
    ("inf,100,8", "unparsable submit time"),
    ("1e300,100,8", "unparsable submit time"),
    ("2023-13-45 00:00:00,100,8", "unparsable submit time"),
    ("0,inf,8", "zero or negative duration"),
    ("0,nan,8", "zero or negative duration"),
    ("0,-5,8", "zero or negative duration"),
    ("0,1e300,8", "duration over a year"),
    ("0,100", "short row"),
    ('0,"100,8\n' + "x" * 200_000, "unreadable CSV row"),  # an unclosed quote runs past the field size limit
]


@pytest.mark.parametrize("row,reason", UNREADABLE, ids=[f"{i}-{r}" for i, (_, r) in enumerate(UNREADABLE)])
def test_unreadable_trace_rows_are_counted(tmp_path, row, reason):
    from transit_launch.sim.trace import load_csv
    p = tmp_path / "t.csv"
    p.write_bytes((HEAD + "0,100,8\n" + row + "\n5,50,4\n").encode("latin-1"))
    t = load_csv(p)
    assert t.dropped == {reason: 1}
    assert t.gpus[0] == 8 and len(t) in (1, 2)  # the unclosed quote swallows the last row too


def test_unreadable_rows_reported_by_the_cli(cli, tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes((HEAD + "\n".join(["0,100,8", "5,50,4", *(r for r, _ in UNREADABLE[:-1])]) + "\n").encode("latin-1"))
    rc, out, err = cli("simulate", "--trace", str(p), "--racks", "1", "--quiet")
    assert rc == 0 and err == "", err
    dropped = next((ln for ln in out.splitlines()[:4] if ln.startswith("dropped: ")), "")  # in the report's head
    assert "4 unparsable GPU count" in dropped and "4 unparsable submit time" in dropped, out


# --- issue 51: what still gave tracebacks or passed silently ---------------------------------

def test_hidden_subcommand_is_not_offered(cli):
    rc, out, err = cli("frobnicate")
    assert rc == 2 and "invalid choice: 'frobnicate'" in err and "'plan'" in err and "_node-loss" not in err
    rc, out, err = cli("--help")
    assert rc == 0 and "_node-loss" not in out


# a directory the user cannot search: as root, the DAC override capabilities dropped first
LOCKED_CASES = [
    ([*PLAN, "--plot", "{L}/x.png"], "cannot create files in {L} (Permission denied)"),
    ([*PLAN, "--plot", "{L}/sub/x.png"], "cannot reach {L}/sub (Permission denied)"),
    ([*RENDER, "-o", "{L}/job.sbatch", *CMD], "cannot create files in {L} (Permission denied)"),
    (["run", "--stats", "{L}/stats", "--", "true"], "--stats {L}/stats: cannot create the directory (Permission"),
    (["plan", "--model", "{L}/config.json"], "cannot read {L}/config.json: Permission denied"),
    (["plan", "--model", "{L}/card.toml"], "cannot read model card {L}/card.toml: Permission denied"),
    (["plan", "--model", "{L}/model"], "cannot read {L}/model: Permission denied"),
    (["plan", "--torchtitan", "{L}/job.toml"], "--torchtitan {L}/job.toml: cannot read it (Permission denied)"),
    (["spank", "build", "--out", "{L}/lib"], "cannot create files in {L} (Permission denied)"),
    (["simulate", "--synthetic", "10", "--plot", "{L}/x.png"], "cannot create files in {L} (Permission denied)"),
]


@pytest.mark.parametrize("args,needle", LOCKED_CASES, ids=[" ".join(a)[:50] for a, _ in LOCKED_CASES])
def test_paths_in_a_directory_the_user_cannot_search(tmp_path, args, needle):
    import shutil
    import subprocess
    import sys
    locked = tmp_path / "locked"
    locked.mkdir()
    prefix = []
    if os.geteuid() == 0:  # root passes permission bits: a directory of nobody's, and no override
        if not shutil.which("setpriv"):
            pytest.skip("needs setpriv (util-linux) to run without CAP_DAC_OVERRIDE as root")
        os.chown(locked, 65534, 65534)
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    locked.chmod(0o700 if prefix else 0)
    try:
        res = subprocess.run([*prefix, sys.executable, "-m", "transit_launch", *[a.replace("{L}", str(locked))
                                                                                  for a in args]],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    finally:
        locked.chmod(0o700)
    assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and needle.replace("{L}", str(locked)) in res.stderr, res.stderr


def test_stdout_that_cannot_be_written(tmp_path):
    import subprocess
    import sys
    cases = [(["plan", "--model", "llama3-70b"], {}, "cannot write to standard output: No space left on device"),
             (["plan", "--help"], {}, "cannot write to standard output: No space left on device"),
             (["render", "--model", "llama3-70b", "--nodes", "3", *CMD], {}, "cannot write to standard output"),
             (["simulate", "--synthetic", "100", "--racks", "8", "--quiet"], {}, "No space left on device")]
    model = tmp_path / "modèle"  # a name an ASCII-only stdout cannot print
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA))
    cases.append((["plan", "--model", str(model)], {"PYTHONIOENCODING": "ascii"},
                  "standard output's encoding (ascii) cannot write '\\xe8': set PYTHONIOENCODING=utf-8"))
    for args, env, needle in cases:
        with open("/dev/full" if not env else os.devnull, "w") as sink:
            res = subprocess.run([sys.executable, "-m", "transit_launch", *args], stdout=sink, stderr=subprocess.PIPE,
                                 text=True, timeout=60, env=dict(os.environ, **env), cwd=tmp_path, check=False)
        errors = [line for line in res.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
        assert res.returncode == 2 and len(errors) == 1 and needle in errors[0], (args, res.stderr)
        assert errors[0].startswith("transit-launch: error: ") and "Exception ignored" not in res.stderr


def test_trace_with_a_byte_order_mark(cli, tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes(b"\xef\xbb\xbf" + (HEAD + "0,100,8\n5,50,4\n").encode())  # as spreadsheets save UTF-8
    rc, out, err = cli("simulate", "--trace", str(p), "--racks", "1", "--quiet")
    assert rc == 0 and err == "" and out.startswith(f"trace: {p} (generic), 2 GPU jobs"), err


def test_policy_off_offloads_nothing_in_the_script(cli):
    # at its no-offload minimum (20 nodes) the plan offloads 3.4 GB under the shim (its 5%
    # reserved gap), but policy off runs no shim: the script must not claim any offload
    rc, out, err = cli("render", "--model", "llama3-70b", "--gpu", "a100-40gb", "--global-batch", "240", "--nodes",
                       "20", *CMD)
    assert rc == 0 and "policy off" in out
    assert "# This job: 20 nodes, dp80, 42.7 GB per GPU, no offloading (policy off).\n" in out
    # policy off asked for below the minimum: the script and a warning say the job cannot fit
    rc, out, err = cli("render", "--model", "llama3-70b", "--policy", "off", "--nodes", "3", *CMD)
    assert rc == 0 and "offload 34.3" not in out
    assert ("# This job: 3 nodes, dp12, 111.4 GB per GPU, 25.9 GB more than the h100-80gb's 85.5 GB, and policy off "
            "offloads nothing: the job runs out of GPU memory.\n") in out
    assert "transit-launch: WARNING: 3 node(s): 25.9 GB more than the h100-80gb's 85.5 GB" in err


def test_submit_does_not_warn_about_the_count_it_recommends(files):
    # llama4-scout under fsdp: nothing reaches --min-efficiency, the plan recommends its fastest, 4 nodes
    env = {"PATH": f"{files / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    rc, _, err = run_cli("submit", "--dry-run", "--model", "llama4-scout", "--nodes", "4", *CMD, env=env)
    assert rc == 0 and "WARNING: 4 node(s)" not in err, err
    assert "transit-launch: 4 node(s): as asked; 137.0 GB per GPU, offload 58.6 GB per GPU, predicted efficiency " \
           "64%; the plan recommends it (nothing fits without offloading" in err
    rc, _, err = run_cli("submit", "--dry-run", "--model", "llama4-scout", "--nodes", "3", *CMD, env=env)
    assert rc == 0 and "WARNING: 3 node(s) push" in err and "the plan recommends 4" in err


def test_missing_slurm_config_fails_fast(tmp_path):
    # Slurm's commands wait a minute for a SLURM_CONF that is not there: this sinfo stands for them
    (tmp_path / "sinfo").write_text("#!/bin/sh\nsleep 30\necho 'sinfo: fatal: Unable to process configuration "
                                    "file' >&2\nexit 1\n")
    (tmp_path / "sinfo").chmod(0o755)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "SLURM_CONF": str(tmp_path / "slurm.conf")}
    rc, out, err = run_cli("submit", "--model", "llama3-70b", *CMD, env=env, timeout=10)
    assert rc == 2 and out == "" and err == (f"transit-launch: error: SLURM_CONF={tmp_path}/slurm.conf: no such file "
                                             "(sinfo would wait a minute for it); point it at the cluster's slurm.conf "
                                             "or unset it\n")
