"""The sweep of inputs that could lose a user's data or hang a job: each one a user reported, named here with the
tests that try it and assert the refusal (or the clean stop) and that nothing the user had was lost. This file checks
that every named test exists and is marked ``bad_input``, so the list cannot silently go stale;
``pytest -m bad_input`` runs them all (together with every other refusal test of the suite)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

SWEEP: dict[str, list[str]] = {
    "two growlm-grow --overwrite into one output at once": [
        "distributed/test_output_writers.py::test_two_growlm_grow_overwrite_one_output",
    ],
    "a second writer of an output another growlm-grow is writing, with and without --overwrite": [
        "distributed/test_output_writers.py::test_a_writer_inside_its_write_refuses_a_second_and_killed_leaves_the_old_output",
    ],
    "a second writer of --export_hf, growlm-prepare --out, growlm-experiment and growlm-bench outputs": [
        "distributed/test_output_writers.py::test_an_export_into_a_folder_being_written_is_refused",
        "unit/test_output_writers_unit.py::test_growlm_prepare_into_a_folder_being_written_is_refused",
        "unit/test_output_writers_unit.py::test_growlm_experiment_into_a_folder_being_written_is_refused",
        "unit/test_output_writers_unit.py::test_growlm_bench_into_a_folder_being_written_is_refused",
    ],
    "DeepSpeed config: zero_optimizaton, AdamWW, betaz, a string or negative lr, gradient_clipping -1, NVMe offload "
    "at stage 0": [
        "unit/test_ds_config_checks.py::test_train_refuses_a_deepspeed_config_by_its_meaning",
        "unit/test_ds_config_checks.py::test_growlm_run_dry_run_refuses_the_same_config",
    ],
    "plan triggers of the wrong kind (step: true, step: 2.5) and a stage past --max_steps": [
        "unit/test_plan_meaning.py::test_the_plan_loader_refuses_a_trigger_value_of_the_wrong_kind",
        "unit/test_plan_meaning.py::test_train_and_growlm_run_refuse_a_step_that_is_not_an_integer",
        "unit/test_plan_meaning.py::test_train_and_growlm_run_refuse_a_stage_the_run_never_reaches",
        "unit/test_plan_meaning.py::test_train_refuses_a_token_trigger_the_run_never_reaches",
    ],
    "a target too large for the machine (train.py's plan, a live growth, growlm-grow, growlm-run) and 64 ranks per "
    "node on a small machine": [
        "unit/test_memory_checks.py::test_train_refuses_a_stage_that_cannot_fit_the_machine",
        "unit/test_memory_checks.py::test_a_live_growth_that_does_not_fit_the_free_memory_is_refused_on_every_rank",
        "unit/test_memory_checks.py::test_dry_run_warns_of_more_ranks_per_node_than_the_machine_has",
        "unit/test_memory_checks.py::test_grow_refuses_a_target_that_does_not_fit_the_free_host_memory",
        "unit/test_memory_checks.py::test_grow_refuses_an_output_that_does_not_fit_the_free_disk_space",
        "unit/test_memory_checks.py::test_run_refuses_more_ranks_than_this_machines_gpus_before_launching",
        "unit/test_memory_checks.py::test_run_refuses_a_live_growth_that_cannot_fit_this_machines_memory_before_launching",
    ],
    "a released-model preset (llama-3.1-8b, llama-3.2-3b) that cannot fit the host, given to a plain train.py run "
    "(killed by the kernel, leaving train.lock, metrics.jsonl and tb/) and to growlm-run --dry_run (0 warnings)": [
        "unit/test_memory_checks.py::test_train_refuses_a_model_that_cannot_fit_the_host_before_building_it",
        "unit/test_memory_checks.py::test_dry_run_warns_where_the_real_run_refuses_for_memory",
    ],
    "llama-3.2-1b at its default seq_len on a 23.5 GiB host, whose model states fit and whose first step's "
    "activations do not (killed by the kernel in step 1)": [
        "unit/test_memory_checks.py::test_train_refuses_the_1b_preset_whose_activations_cannot_fit_the_host",
        "unit/test_memory_checks.py::test_train_refuses_a_stage_whose_grown_model_cannot_train_here",
    ],
    "a truncated model.safetensors (growlm-eval, --init_from) and a corrupt curve JSON (--report_only)": [
        "unit/test_output_writers_unit.py::test_growlm_eval_of_a_truncated_safetensors_names_it",
        "unit/test_output_writers_unit.py::test_init_from_a_truncated_safetensors_names_it",
        "unit/test_output_writers_unit.py::test_report_only_over_a_damaged_curve_names_it",
    ],
    "SIGTERM to the deepspeed command of a bare deepspeed train.py job; SIGINT to one rank": [
        "distributed/test_stop.py::test_sigterm_to_the_deepspeed_command_stops_every_rank_after_a_step_and_saves",
        "distributed/test_stop.py::test_sigint_to_one_rank_stops_both_at_the_same_step",
    ],
    "Ctrl-C inside growlm-grow, growlm-eval, growlm-prepare": [
        "distributed/test_output_writers.py::test_ctrl_c_inside_a_write_ends_in_one_line_and_keeps_the_old_output",
        "unit/test_interrupt.py::test_each_command_turns_ctrl_c_into_one_line",
    ],
    "--resume with another --max_steps under total_num_steps auto": [
        "distributed/test_resume_schedule_runs.py::test_resume_keeps_the_saved_schedule_and_new_schedule_takes_the_configs",
        "unit/test_resume_schedule.py::test_the_resume_says_which_schedule_it_trains_on_with_both_lrs",
    ],
    "--total_num_steps (and every other stage flag) with --growth_plan": [
        "unit/test_plan_meaning.py::test_growlm_grow_refuses_stage_flags_that_a_plan_would_override",
    ],
    "growlm-grow CKPT OUT --option foo=1 or --ramp_steps 5 (any growth flag) without a target flag, --zero_stage or "
    "a growth flag with --export_hf, --stage without --growth_plan": [
        "unit/test_plan_meaning.py::test_growlm_grow_refuses_a_growth_flag_without_a_target",
        "unit/test_plan_meaning.py::test_growlm_grow_refuses_every_flag_its_command_would_ignore",
    ],
    "growlm-grow on a run shorter than its warm-up (warmup_num_steps 20 > total 4)": [
        "distributed/test_grow_checkpoint.py::test_bad_input_is_refused_before_writing",
    ],
    "a transformers folder of a model type growlm does not read (Mistral) given to growlm-eval or --init_from": [
        "unit/test_foreign_models_and_quoting.py::test_growlm_eval_names_a_mistral_folder",
        "unit/test_foreign_models_and_quoting.py::test_init_from_names_a_mistral_folder",
    ],
    "a Llama folder growlm cannot run exactly (rope scaling other than linear and llama3, such as 'yarn', biases, "
    "another activation or class), missing or damaged safetensors or shards, weights or a tokenizer that do not fit "
    "its config.json": [
        "unit/test_llama_init_from_unit.py::test_llama_variants_growlm_does_not_run_are_refused",
        "unit/test_llama_init_from_unit.py::test_missing_or_damaged_safetensors_are_refused",
        "unit/test_llama_init_from_unit.py::test_damaged_shards_are_refused",
        "unit/test_llama_init_from_unit.py::test_weights_that_do_not_fit_the_config_are_refused",
        "unit/test_llama_init_from_unit.py::test_a_tokenizer_larger_than_the_vocabulary_is_refused",
        "unit/test_llama_eval_load.py::test_growlm_eval_refuses_what_it_cannot_score_exactly",
    ],
    "a transformers folder's config.json with head_dim 15, num_attention_heads 0, vocab_size as a string, hidden 64 "
    'over 5 heads without head_dim, a llama3 rope factor "8" (train.py --init_from, growlm-eval, growlm-prepare '
    "--tokenizer); weights that are not its config's model (a Qwen 2 q_proj.bias missing, 3 layers over weights of "
    "2, another vocabulary, an o_proj.bias, a tied config with a head of its own) given to growlm-eval": [
        "unit/test_hf_folder_checks.py::test_a_malformed_config_value_is_one_line_in_eval_and_init_from",
        "unit/test_hf_folder_checks.py::test_weights_that_are_not_the_configs_model_are_refused_by_eval_as_by_init_from",
        "unit/test_hf_folder_checks.py::test_growlm_prepare_reads_a_model_folders_config_with_the_same_reader",
    ],
    "growlm-prepare --tokenizer: no --out, a folder without tokenizer.json, a damaged one, more ids than uint16, a bos "
    "token the tokenizer lacks": [
        "unit/test_prepare_model_tokenizer.py::test_tokenizers_that_cannot_make_a_token_folder_are_refused",
        "unit/test_prepare_bos.py::test_a_folder_asking_for_a_bos_it_does_not_have_is_refused",
    ],
    "a token folder whose ids lie past its vocab_size (all of train.bin, a few positions, one id of val.bin); a "
    "meta.json without vocab_size, a split without n_tokens or file, splits as a list, vocab_size as a string or -1, "
    "n_tokens as a float or a string, an eot_token_id past the vocabulary (train.py, growlm-eval and growlm-prepare "
    "--tokenizer, open_tokens)": [
        "unit/test_token_folder_checks.py::test_train_refuses_a_bad_token_folder_up_front",
        "unit/test_token_folder_checks.py::test_open_tokens_refuses_what_train_refuses",
        "unit/test_token_folder_checks.py::test_growlm_eval_and_growlm_prepare_refuse_a_bad_token_folder_as_tokenizer",
        "distributed/test_token_folder_runs.py::test_ids_past_the_vocabulary_are_refused_in_one_line_on_two_ranks",
    ],
    "growlm-prepare --tokenizer: a model folder whose tokenizer has more ids than its config.json's vocab_size, and "
    "a token folder (its meta.json names the end-of-text token)": [
        "unit/test_token_folder_checks.py::test_growlm_prepare_refuses_a_tokenizer_larger_than_its_folders_vocabulary",
        "unit/test_prepare_model_tokenizer.py::test_a_token_folder_is_taken_as_the_tokenizer",
    ],
    "Llama-only shape flags (--n_kv_head, --head_dim, --rope_theta, --rms_norm_eps, --tie_word_embeddings, "
    "--untie_word_embeddings) with a GPT-2 preset or checkpoint, and Llama shapes that cannot be built": [
        "unit/test_llama_train_flags.py::test_llama_flags_are_refused_for_a_gpt2_model",
        "unit/test_llama_train_flags.py::test_llama_flags_are_refused_on_a_gpt2_checkpoint_and_kept_on_a_llama_one",
        "unit/test_llama_train_flags.py::test_bad_llama_shapes_are_refused",
    ],
}


def marked_tests(path: Path) -> dict[str, bool]:
    """Test function name -> whether it (or its module, through ``pytestmark``) carries ``pytest.mark.bad_input``."""
    tree = ast.parse(path.read_text())
    module_mark = any(
        isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
        and "bad_input" in ast.unparse(n.value)
        for n in tree.body
    )  # fmt: skip
    return {
        n.name: module_mark or any("bad_input" in ast.unparse(d) for d in n.decorator_list)
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    }


@pytest.mark.parametrize("case", sorted(SWEEP))
def test_each_reported_input_has_marked_tests(case):
    for node in SWEEP[case]:
        file, name = node.split("::")
        tests = marked_tests(TESTS / file)
        assert name in tests, f"{case}: {node} does not exist"
        assert tests[name], f"{case}: {node} is not marked bad_input"
