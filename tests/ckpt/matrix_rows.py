"""The client matrix's rows (issue 23): `save` on one node, `resume` on the next; each
row prints `row <name> ok <digest>` or `row <name> error <call>: <errno name> <message>`,
then `took <name> <seconds> s` (what it costs the suite: `pytest -s` shows it)."""

import errno
import hashlib
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Mapping

warnings.simplefilter("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402

MODE, D = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)


def digest(sd: Mapping[str, object]) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        v = sd[k]
        h.update(k.encode())
        if isinstance(v, torch.Tensor):
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()[:16]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def row_torch() -> str:
    """torch.save into a temporary directory, renamed; `latest` a symlink; metrics appended."""
    if MODE == "save":
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        m(torch.ones(8, 64)).sum().backward()
        opt.step()
        os.makedirs(f"{D}/torch/tmp-ckpt-1")
        torch.save(
            {"model": m.state_dict(), "opt": opt.state_dict(), "step": 1},
            f"{D}/torch/tmp-ckpt-1/state.pt",
        )
        os.replace(f"{D}/torch/tmp-ckpt-1", f"{D}/torch/checkpoint-1")
        os.symlink("checkpoint-1", f"{D}/torch/latest")
        for step in (1, 2):
            with open(f"{D}/torch/metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step}) + "\n")
        return digest(m.state_dict())
    st = torch.load(f"{D}/torch/latest/state.pt")
    with open(f"{D}/torch/metrics.jsonl") as f:
        steps = [json.loads(x)["step"] for x in f]
    assert st["step"] == 1 and steps == [1, 2], (st["step"], steps)
    assert os.readlink(f"{D}/torch/latest") == "checkpoint-1"
    return digest(st["model"])


def row_dcp() -> str:
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    if MODE == "save":
        sd = model().state_dict()
        dcp_save(sd, checkpoint_id=f"{D}/dcp/step-1")
        return digest(sd)
    sd = {k: torch.empty_like(v) for k, v in model().state_dict().items()}
    dcp_load(sd, checkpoint_id=f"{D}/dcp/step-1")
    return digest(sd)


def row_safetensors() -> str:
    from safetensors.torch import load_file, save_file

    if MODE == "save":
        sd = {k: v.contiguous() for k, v in model().state_dict().items()}
        os.makedirs(f"{D}/st", exist_ok=True)
        save_file(sd, f"{D}/st/model.safetensors")
        return digest(sd)
    return digest(load_file(f"{D}/st/model.safetensors"))


def row_numpy_memmap() -> str:
    if MODE == "save":
        a = np.arange(3_000_000, dtype=np.float32)
        os.makedirs(f"{D}/np", exist_ok=True)
        np.save(f"{D}/np/arr.npy", a)
        return hashlib.sha256(a.tobytes()).hexdigest()[:16]
    a = np.load(f"{D}/np/arr.npy", mmap_mode="r")
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def row_lightning() -> str:
    """ModelCheckpoint(save_last="link"): last.ckpt a relative symlink to the newest."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def training_step(self, batch: list[torch.Tensor], _i: int) -> torch.Tensor:
            out: torch.Tensor = self.net(batch[0]).sum()
            return out

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.ones(16, 64)), batch_size=4
    )
    root = f"{D}/pl"
    ck = ModelCheckpoint(
        dirpath=f"{root}/ckpts", save_last="link", every_n_train_steps=2, save_top_k=-1
    )
    steps = 4 if MODE == "save" else 6
    t = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ck],
        default_root_dir=root,
    )
    m = Tiny()
    t.fit(m, data, ckpt_path=None if MODE == "save" else f"{root}/ckpts/last.ckpt")
    link = f"{root}/ckpts/last.ckpt"
    assert os.path.islink(link), "last.ckpt is no symlink (Lightning fell back to a copy)"
    assert t.global_step == steps, t.global_step
    if MODE == "save":
        return digest(torch.load(link, weights_only=False)["state_dict"])
    # resumed from step 4's last.ckpt: the state it loaded is what the save job wrote
    first = torch.load(f"{root}/ckpts/epoch=0-step=4.ckpt", weights_only=False)
    return digest(first["state_dict"])


def row_transformers() -> str:
    """save_pretrained/from_pretrained, and a Trainer that saves and resumes."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    cfg = GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=97,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )

    class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 16

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = torch.arange(i, i + 16) % 97
            return {"input_ids": ids, "labels": ids}

    if MODE == "save":
        torch.manual_seed(0)
        m = GPT2LMHeadModel(cfg)
        m.save_pretrained(f"{D}/hf/model")
        want = digest(m.state_dict())
    else:
        m = GPT2LMHeadModel.from_pretrained(f"{D}/hf/model")
        want = digest(m.state_dict())
    args = TrainingArguments(
        output_dir=f"{D}/hf/run",
        max_steps=4 if MODE == "save" else 6,
        save_steps=2,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="steps",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    tr = Trainer(model=m, args=args, train_dataset=Data())
    tr.train(resume_from_checkpoint=None if MODE == "save" else True)
    assert tr.state.global_step == args.max_steps, tr.state.global_step
    if MODE == "resume":
        saved = os.listdir(f"{D}/hf/run")
        assert "checkpoint-6" in saved and "checkpoint-4" in saved, saved
    # The checkpoint the resume started from, byte for byte on both nodes.
    h = hashlib.sha256()
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        with open(f"{D}/hf/run/checkpoint-4/{name}", "rb") as f:
            h.update(f.read())
    return f"{want}-{h.hexdigest()[:16]}"


def row_orbax() -> str:
    """Orbax's CheckpointManager with JAX on the CPU: steps saved into
    `<step>.orbax-checkpoint-tmp` directories renamed into place (tensorstore's OCDBT
    files inside), max_to_keep pruning the oldest; the resume restores the latest step
    and saves on."""
    import jax
    import orbax.checkpoint as ocp

    def state(step: int) -> dict[str, object]:
        k = jax.random.PRNGKey(step)
        w = jax.random.normal(k, (64, 32))
        return {"params": {"w": w, "b": jax.numpy.arange(32.0) * step}, "step": step}

    def digest_tree(tree: dict[str, object]) -> str:
        h = hashlib.sha256()
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            h.update(jax.tree_util.keystr(path).encode())
            h.update(np.asarray(leaf).tobytes())
        return h.hexdigest()[:16]

    opts = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(f"{D}/orbax", options=opts) as mgr:
        if MODE == "save":
            for step in (1, 2, 3):
                mgr.save(step, args=ocp.args.StandardSave(state(step)))
            mgr.wait_until_finished()
            assert mgr.all_steps() == [2, 3], mgr.all_steps()
            return digest_tree(state(3))
        step = mgr.latest_step()
        assert step == 3, (step, os.listdir(f"{D}/orbax"))
        template = jax.tree.map(np.zeros_like, state(0))
        got = mgr.restore(step, args=ocp.args.StandardRestore(template))
        mgr.save(4, args=ocp.args.StandardSave(state(4)))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [3, 4], mgr.all_steps()
    names = sorted(os.listdir(f"{D}/orbax"))
    assert names == ["3", "4"], names  # no temporary directory or lock file left
    return digest_tree(got)


ROWS = {
    "torch": row_torch,
    "dcp": row_dcp,
    "safetensors": row_safetensors,
    "numpy_memmap": row_numpy_memmap,
    "lightning": row_lightning,
    "transformers": row_transformers,
    "orbax": row_orbax,
}

for name in sys.argv[3:] or ROWS:
    t0 = time.monotonic()
    try:
        print(f"row {name} ok {ROWS[name]()}", flush=True)
    except ImportError as exc:
        print(f"row {name} missing {exc.name or exc}", flush=True)
    except OSError as exc:
        call = traceback.extract_tb(exc.__traceback__)[-1]
        print(
            f"row {name} error {call.name}: {errno.errorcode.get(exc.errno or 0)} {exc}", flush=True
        )
    except Exception as exc:  # the row failed: say how, the other rows go on
        print(f"row {name} failed {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
    print(f"took {name} {time.monotonic() - t0:.1f} s", flush=True)  # the suite's budget
