"""The config files (transit_launch/config.py): the site's, then the user's, then the flags;
every bad file or value one line naming the file."""

import json

from tests.conftest import run_cli


def _env(tmp_path, site=None, user=None):
    """Site and user config files with these texts (None: absent)."""
    (tmp_path / "xdg" / "transit-launch").mkdir(parents=True)
    if user is not None:
        (tmp_path / "xdg" / "transit-launch" / "config.toml").write_text(user)
    if site is not None:
        (tmp_path / "site.toml").write_text(site)
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "TRANSIT_LAUNCH_SITE_CONFIG": str(tmp_path / "site.toml")}


def _plan(env, *flags):
    rc, out, err = run_cli("plan", "--model", "llama3-70b", "--json", *flags, env=env)
    assert rc == 0, err
    d = json.loads(out)
    return {"gpu": d["gpu"]["name"], "gpus_per_node": d["gpus_per_node"], "min_efficiency": d["min_efficiency"]}


def test_user_wins_over_site_and_flags_over_both(tmp_path):
    env = _env(tmp_path, site='gpu = "a100-80gb"\ngpus-per-node = 4\nmin-efficiency = 0.8\n',
               user="gpus_per_node = 2\n")
    req = _plan(env)
    assert (req["gpu"], req["gpus_per_node"], req["min_efficiency"]) == ("a100-80gb", 2, 0.8)
    req = _plan(env, "--gpus-per-node", "8", "--gpu", "h200-141gb")
    assert (req["gpu"], req["gpus_per_node"]) == ("h200-141gb", 8)
    # no files: the built-in defaults
    assert _plan(_env(tmp_path / "none"))["gpu"] == "h100-80gb"


def test_partition_and_account_reach_the_job(tmp_path):
    env = _env(tmp_path, user='partition = "gpu-a"\naccount = "proj7"\n')
    rc, script, err = run_cli("render", "--nodes", "1", "--policy", "off", "--", "python", "t.py", env=env)
    assert rc == 0, err
    assert "#SBATCH --partition=gpu-a\n" in script and "#SBATCH --account=proj7\n" in script
    rc, script, _ = run_cli("render", "--nodes", "1", "--policy", "off", "--partition", "gpu-b", "--", "python",
                            "t.py", env=env)
    assert "#SBATCH --partition=gpu-b\n" in script


def test_bad_files_are_one_line_naming_the_file(tmp_path):
    cases = {"gpus = 4\n": "unknown key 'gpus'", "gpus_per_node = 0\n": "gpus-per-node = '0'",
             'gpu = "b300"\n': "not a known GPU", "min-efficiency = 2.0\n": "min-efficiency",
             "gpu = [1]\n": "string or a number", "gpu = \n": "is not TOML", 'partition = "a b"\n': "whitespace"}
    for i, (text, said) in enumerate(cases.items()):
        env = _env(tmp_path / str(i), user=text)
        rc, out, err = run_cli("plan", "--model", "llama3-70b", env=env)
        lines = err.strip().splitlines()
        if "partition" in text:  # plan takes no partition: the file's value is checked where it is used
            rc, out, err = run_cli("render", "--nodes", "1", "--", "python", "t.py", env=env)
            lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and said in lines[0], (text, err)
        if "partition" not in text:
            assert "config.toml" in lines[0]
    (tmp_path / "d" / "xdg" / "transit-launch" / "config.toml").mkdir(parents=True)
    rc, _, err = run_cli("plan", "--model", "llama3-70b",
                         env={"XDG_CONFIG_HOME": str(tmp_path / "d" / "xdg"), "TRANSIT_LAUNCH_SITE_CONFIG": "/nonexistent"})
    assert rc == 2 and "is a directory" in err and err.count("\n") == 1
