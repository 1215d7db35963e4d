"""``runtime.engine.repair_adam_steps`` in one process: DeepSpeed's ZeRO-3 universal loader puts one ``step`` tensor
in every parameter group's Adam state; after the repair each entry has its own tensor with the loaded value, so each
group counts its own steps. (The multi-rank resumes that need it: tests/distributed/test_resume_exact.py.)
"""

from __future__ import annotations

import torch


# the reproduction of the shared-Adam-step report: 2 layers, n_embd 64, micro batch 4, lr 3e-3, 2 warm-up steps
def test_repair_adam_steps_unshares_the_step_so_each_group_counts_once():
    from growlm.runtime.engine import repair_adam_steps

    class Engine:  # what repair_adam_steps reads: engine.optimizer (here the torch optimizer itself)
        def __init__(self, opt):
            self.optimizer = opt

    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([{"params": [a], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}], lr=1e-2)
    shared = torch.tensor(3.0)  # what DeepSpeed's ZeRO-3 universal loader leaves: one tensor in every group
    for p in (a, b):
        opt.state[p].update(step=shared, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    assert repair_adam_steps(Engine(opt)) == 1
    assert opt.state[a]["step"] is not opt.state[b]["step"]
    a.grad, b.grad = torch.ones(3), torch.ones(2)
    opt.step()
    assert [float(opt.state[p]["step"]) for p in (a, b)] == [4.0, 4.0]  # shared, they would read 5.0 and 5.0
    assert repair_adam_steps(Engine(opt)) == 0


def test_a_fused_optimizer_gets_its_fused_groups_and_float32_steps_back_after_a_universal_load():
    """The universal loaders write the saved step (a CPU tensor, here float64 as a CPU run may save it) and the saved
    group flags (``fused`` False from a run without it) past ``load_state_dict``; the repair restores what the fused
    kernel needs. (On a CPU the parameter's device is the CPU: the move itself is the GPU's case.)"""
    from growlm.runtime.engine import repair_adam_steps

    class Engine:
        def __init__(self, opt):
            self.optimizer = opt

    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([{"params": [a]}, {"params": [b]}], lr=1e-2, fused=True)
    shared = torch.tensor(3.0, dtype=torch.float64)
    for group in opt.param_groups:
        group.update(fused=False, foreach=None)  # the saved groups of an unfused run
    for p in (a, b):
        opt.state[p].update(step=shared, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    assert repair_adam_steps(Engine(opt)) == 1
    assert [(g["fused"], g["foreach"]) for g in opt.param_groups] == [(True, False), (True, False)]
    for p in (a, b):
        st = opt.state[p]["step"]
        assert st.dtype == torch.float32 and st.device == p.device and float(st) == 3.0
    a.grad, b.grad = torch.ones(3), torch.ones(2)
    opt.step()  # the fused kernel
    assert [float(opt.state[p]["step"]) for p in (a, b)] == [4.0, 4.0]
    unfused = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=1e-2)
    assert repair_adam_steps(Engine(unfused)) == 0 and unfused.param_groups[0]["fused"] is None  # left as it was
