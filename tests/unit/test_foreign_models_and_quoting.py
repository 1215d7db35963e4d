"""A transformers folder of a model type growlm does not read (here a Mistral) is named for what it is (growlm-eval
and train.py --init_from), and the commands growlm suggests in its messages are shell-quoted: a path with a space
can be pasted as it is."""

from __future__ import annotations

import errno
import json
import shlex
from pathlib import Path

import pytest
from cli_utils import one_error_line, train_fails

from growlm.eval.metrics import cli as eval_cli
from growlm.runtime.checkpoint import LATEST, save_failed_message

MISTRAL = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512}  # fmt: skip
NOT_READ = (
    "config.json says model_type 'mistral'; growlm reads GPT-2, Llama and Qwen 2 folders (model_type "
    "'gpt2', GPT2LMHeadModel; 'llama', LlamaForCausalLM; 'qwen2', Qwen2ForCausalLM)"
)


def mistral_folder(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(MISTRAL))
    (path / "model.safetensors").write_bytes(b"not read")
    return path


@pytest.mark.bad_input
def test_growlm_eval_names_a_mistral_folder(capsys, tmp_path):
    folder = mistral_folder(tmp_path / "my mistral")
    assert eval_cli.main([str(folder), "--sets", "heldout"]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-eval") == f"{folder}: {NOT_READ}"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.bad_input
def test_init_from_names_a_mistral_folder(capsys, tmp_path):
    folder = mistral_folder(tmp_path / "mistral")
    line = train_fails(capsys, ["--init_from", str(folder), "--out_dir", str(tmp_path / "run")])
    assert line == f"growlm-train: error: --init_from {folder}: {NOT_READ}"
    assert not (tmp_path / "run").exists()


def test_a_suggested_resume_command_is_shell_quoted(tmp_path):
    ckpts = tmp_path / "my runs" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / LATEST).write_text("global_step2")
    msg = save_failed_message(OSError(errno.ENOSPC, "No space left on device"), ckpts / "global_step4")
    assert msg.endswith(f"and --resume {shlex.quote(str(ckpts))}")
    assert shlex.split(msg.rsplit("and ", 1)[1]) == ["--resume", str(ckpts)]


def test_a_suggested_prepare_command_is_shell_quoted(capsys, tmp_path):
    data = tmp_path / "my data"
    line = train_fails(capsys, ["--data", str(data), "--out_dir", str(tmp_path / "run")])
    command = line.split("`")[1]
    assert shlex.split(command)[-2:] == ["--out", str(data)]
