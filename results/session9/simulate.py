"""Replay the hybrid proposer offline against the target's own greedy outputs: tau and modelled speed-up, noise-free.

Greedy acceptance depends only on the target's greedy continuation, so once that is cached (one plain
`generate` per prompt) every round of the engine's look-up sources (suffix, global index, datastore),
its draft trees and its goodput verify length can be replayed without a target forward. A round
costs the measured verify cost of its node count (a fixed curve, `--costs`); the plain step is that
curve at 1 token. The drafter block is not simulated (it needs the target's hidden states), so compare
configurations of the look-up sources with each other, not with the bench's `adaflash` row.

python results/session9/simulate.py cache  [num_prompts_per_domain] [dtype]      # once: greedy outputs
python results/session9/simulate.py run CONFIG [CONFIG ...]                      # e.g. nodes=16,branches=3 nodes=0
   CONFIG keys: nodes, branches, max_suffix, prior_weight, sources (e.g. suffix+datastore), prior (a file),
   warm (1: eval rows twice, 2: held-out training rows first), cap, oracle, scale, drafter_ms,
   score_cost, any DraftingConfig field; SIM_DRAFTS=file picks the cached drafter blocks, SIM_DATASTORE=file the datastore
"""
import json
import os
import sys
from pathlib import Path

import torch

from adaflash_hf.decoding.cost import VerifyCostModel
from adaflash_hf.decoding.policy import GoodputVerifyLength
from adaflash_hf.decoding.proposers import DraftingConfig, DraftingState, HybridProposer, load_datastore

CACHE = Path("/work/sim_cache/smollm2_bf16.json")
DRAFTS = Path(os.environ.get("SIM_DRAFTS", "/work/sim_cache/smollm2_bf16_drafts.json"))
TRAIN_DATA = Path(__file__).resolve().parents[2] / "data/smollm2-135m/train"
TRAIN_ROWS, TRAIN_DRAFTS = Path("/work/sim_cache/train_rows.json"), Path("/work/sim_cache/train_drafts.json")
DRAFTER_MS = 2.6  # one drafter pass, bf16, batch 1: draft layer 2.1 ms + 4k draft head 0.5 ms (results/session9/drafter_cost.py)
BUNDLED = Path(__file__).resolve().parents[2] / "adaflash_hf/bundled/smollm2-135m"
DATASTORE = Path(os.environ.get("SIM_DATASTORE", BUNDLED / "datastore.safetensors"))  # session 17: another datastore
# bf16 SmolLM2 forward of k new tokens over a 256-token cache, ms (session 8, results/session8/verify_cost.py)
COSTS = {1: 39.4, 2: 46.6, 4: 51.5, 8: 58.2, 12: 69.0, 16: 77.4, 24: 97.1, 32: 111.7}
if os.environ.get("SIM_COSTS"):  # another verify-cost curve, JSON {"tokens": ms}
    COSTS = {int(k): float(v) for k, v in json.loads(os.environ["SIM_COSTS"]).items()}
ROUND_OVERHEAD_MS = 0.8  # look-ups, tree building and bookkeeping per round (profile: 0.2-0.5 ms + tree)


def cache(n: int, dtype: str) -> None:
    from adaflash_hf import load_target
    from adaflash_hf.bench import BenchArgs, load_bench_prompts
    from adaflash_hf.cli_args import encode_prompt

    torch.set_num_threads(2)
    target, tok = load_target("smollm2-135m", dtype=dtype)
    rows = []
    for item in load_bench_prompts(BenchArgs(num_prompts=n, methods="target")):
        ids = encode_prompt(tok, item["prompt"])
        with torch.inference_mode():
            out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=96, do_sample=False,
                                  pad_token_id=tok.pad_token_id)
        rows.append({"domain": item["domain"], "prompt": ids[0].tolist(), "output": out[0, ids.shape[1]:].tolist()})
        print(item["domain"], len(rows), flush=True)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(rows))


def cache_drafter(dtype: str, vocab: int = 0, top: int = 16, rows_path: Path | None = None, out_path: Path | None = None) -> None:
    """Per prompt and anchor position: the bundled drafter's block (top-1 ids and probs) and its top-``top``
    tokens per position, from one teacher-forced target forward over prompt + output (the features the
    engine would have read by then)."""
    from transformers import DynamicCache

    from adaflash_hf import load_target
    from adaflash_hf.decoding.proposers import DraftHead
    from adaflash_hf.decoding.state import context_features, draft_block
    from adaflash_hf.drafters import load_drafter

    torch.set_num_threads(2)
    target, _ = load_target("smollm2-135m", dtype=dtype)
    drafter = load_drafter(os.environ.get("SIM_DRAFTER", "auto"), target, target_name="smollm2-135m")
    draft_vocab = drafter.draft_vocab
    if vocab:  # the `vocab` most frequent tokens of the datastore (the target's own outputs) within the shipped draft vocabulary
        from collections import Counter

        from safetensors.torch import load_file

        counts = Counter(load_file(str(BUNDLED / "datastore.safetensors"))["tokens"].tolist())
        allowed = set(draft_vocab.tolist())
        draft_vocab = torch.tensor(sorted(sorted((t for t in allowed), key=lambda t: (-counts.get(t, 0), t))[:vocab]))
    head, embed = DraftHead(target.get_output_embeddings(), draft_vocab), target.get_input_embeddings()
    layers = drafter.config.target_layer_ids
    rows = json.loads((rows_path or CACHE).read_text())
    blocks = []
    with torch.inference_mode():
        for row in rows:
            full = torch.tensor([row["prompt"] + row["output"]])
            out = target(input_ids=full, output_hidden_states=True)
            feats = context_features(out.hidden_states, layers)
            cache, read, per_anchor = DynamicCache(), 0, []
            P = len(row["prompt"])
            for k in range(1, len(row["output"])):  # anchor: output[k-1] at position P+k-1
                p = P + k - 1
                hidden = draft_block(drafter, embed, full[:, p], feats[:, read:p], torch.arange(read, p)[None],
                                     torch.tensor([p]), torch.ones(1, p, dtype=torch.long), cache)
                read = p
                logits = head.logits(hidden[:, 1:]).float()
                probs = logits.softmax(-1)[0]
                tp, ti = probs.topk(top, -1)
                per_anchor.append({"ids": head.to_target_ids(ti).tolist(), "probs": tp.tolist()})
            blocks.append(per_anchor)
            print(len(blocks), flush=True)
    (out_path or DRAFTS).write_text(json.dumps(blocks))


def cache_train(n: int) -> None:
    """The last ``n`` cached training responses (prompt, first 96 response tokens, full response), for a warm-up
    pass whose datastore leaves those responses out, and their drafter blocks."""
    from safetensors.torch import load_file

    shards = sorted(TRAIN_DATA.glob("*/shard_*.safetensors"))
    rows = []
    for shard in reversed(shards):
        tensors = load_file(str(shard))
        pieces = torch.split(tensors["ids"].long(), tensors["lengths"].tolist())
        for ids, start in zip(pieces, tensors["starts"].tolist()):
            ids = ids.tolist()
            rows.append({"domain": "train", "prompt": ids[:start], "output": ids[start:start + 96], "response": ids[start:]})
        if len(rows) >= n:
            break
    TRAIN_ROWS.write_text(json.dumps(rows[:n]))
    cache_drafter("bf16", rows_path=TRAIN_ROWS, out_path=TRAIN_DRAFTS)


def parse(spec: str) -> dict:
    out = {"nodes": 16, "branches": 3, "max_suffix": None, "prior_weight": 4.0, "sources": "suffix+global+datastore"}
    for part in filter(None, spec.split(",")):
        key, _, value = part.partition("=")
        out[key] = value if key in ("sources", "prior") else float(value) if "." in value else int(value)
    return out


def walk(tokens, parents, n, truth):
    """Greedy tree acceptance against the target's continuation: the accepted node path (1-based)."""
    path, node, depth = [], 0, 0
    while depth < len(truth):
        child = next((j + 1 for j in range(n) if parents[j] == node and tokens[j] == truth[depth]), None)
        if child is None:
            break
        path.append(child)
        node, depth = child, depth + 1
    return path


def simulate(rows, spec: dict) -> dict:
    sources = spec["sources"].split("+")
    extra = {k: v for k, v in spec.items() if k not in ("nodes", "branches", "max_suffix", "prior_weight", "sources", "oracle", "scale", "drafter_runnerups", "warm", "cap", "prior", "drafter_ms", "score_cost")}
    config = DraftingConfig(suffix="suffix" in sources, global_index="global" in sources, datastore="datastore" in sources,
                            tree_nodes=spec["nodes"], branches=spec["branches"],
                            **({"max_suffix_tokens": spec["max_suffix"]} if spec["max_suffix"] else {}), **extra)
    state = DraftingState(config)
    drafter_ms = spec.get("drafter_ms", DRAFTER_MS)
    if "score_cost" in spec:
        state.SCORE_COST = spec["score_cost"]
    state.estimator.prior_weight = spec["prior_weight"]
    if spec.get("prior"):  # a shipped acceptance_prior.json (adaflash prepare-drafter --acceptance-prompts)
        from adaflash_hf.decoding.proposers import load_acceptance_prior

        state.seed_acceptance(load_acceptance_prior(spec["prior"]))
    if spec.get("scale"):  # multiply every estimated rate (a calibration probe)
        base_rate, factor = state.estimator.rate, spec["scale"]
        state.estimator.rate = lambda source, feature: factor * base_rate(source, feature)
    model = VerifyCostModel()
    model.seconds = {k: v / 1000 for k, v in COSTS.items()}
    policy = GoodputVerifyLength(cost_model=model)
    datastore = load_datastore(DATASTORE) if config.datastore else None
    train_rows = json.loads(TRAIN_ROWS.read_text()) if spec.get("warm") == 2 else []
    if train_rows and config.datastore:  # the warm-up's own responses leave the datastore
        from safetensors.torch import load_file

        from adaflash_hf.decoding.proposers import NGramIndex

        held = {tuple(row["response"]) for row in train_rows}
        tensors = load_file(str(DATASTORE))
        datastore = NGramIndex(config.max_ngram)
        for stream in torch.split(tensors["tokens"].long(), tensors["lengths"].tolist()):
            if tuple(stream.tolist()) not in held:
                datastore.start_stream(stream.tolist())
    use_drafter = "drafter" in sources
    state.cost_model = model
    blocks = json.loads(DRAFTS.read_text()) if use_drafter else None
    if train_rows and use_drafter:
        blocks = json.loads(TRAIN_DRAFTS.read_text()) + blocks
    elif spec.get("warm") and use_drafter:
        blocks = blocks + blocks
    proposer = HybridProposer(state, config, 8 if use_drafter else None, datastore)
    current = {}
    if spec.get("drafter_runnerups"):  # probe: the drafter's runner-up tokens at block position 1 as extra one-node branches
        from adaflash_hf.decoding.proposers import drafter_feature

        base_tree = proposer._tree_proposal

        def with_runnerups(options_per_row, max_depths):
            block = current.get("block")
            if block is not None and any(o[0] == "drafter" for o in options_per_row[0]):
                for rank in range(1, 1 + spec["drafter_runnerups"]):
                    token, prob = block["ids"][0][rank], block["probs"][0][rank]
                    options_per_row[0].append(("drafter", [token], [drafter_feature(0, prob) + (rank,)]))
            return base_tree(options_per_row, max_depths)

        proposer._tree_proposal = with_runnerups
    per_domain: dict[str, list[float]] = {}
    stats = {"verified": 0, "accepted": 0, "failed_rounds": 0}
    # warm=1: a first pass over the eval rows themselves (an upper bound); warm=2: over held-out training rows
    warm = train_rows if train_rows else rows if spec.get("warm") else []
    passes = [("warm", warm), ("measure", rows)] if warm else [("measure", rows)]
    for r, (phase, row) in enumerate((phase, row) for phase, part in passes for row in part):
        if phase == "measure" and r == len(warm) and warm:  # a warm estimator, an empty global index
            state.forget_requests()
            per_domain.clear()
            cap = spec.get("cap")
            if cap:  # the warm counts as a prior worth at most `cap` observations per feature
                est = state.estimator
                for key, seen in list(est.seen.items()):
                    if seen > cap:
                        est.hits[key] = est.hits.get(key, 0.0) * cap / seen
                        est.seen[key] = float(cap)
            for key in stats:
                stats[key] = 0
            if datastore is not None and train_rows:  # the bench's datastore: every cached response
                proposer.datastore = load_datastore(DATASTORE)
        truth, produced, spent, rounds = row["output"], 1, 0.0, 0  # the prefill gives the first token
        proposer.add_row(r, row["prompt"] + truth[:1])
        while produced < len(truth):
            budget = len(truth) - produced
            ran = []
            current["block"] = None

            def run_drafter(r=r, produced=produced, ran=ran):
                block = current["block"] = blocks[r][produced - 1]  # anchor: the newest token, truth[produced - 1]
                ran.append(True)

                def score(queries):  # the drafter's probability of each candidate token (0 outside its top 16)
                    return [[dict(zip(block["ids"][j], block["probs"][j])).get(t, 0.0) if j < len(block["ids"]) else None
                             for j, t in enumerate(tokens)] for _, tokens in queries]

                return torch.tensor([[ids[0] for ids in block["ids"]]]), torch.tensor([[p[0] for p in block["probs"]]]), score

            proposal = proposer.propose([r], run_drafter if use_drafter else None, tree=proposer.trees, max_depths=[budget - 1])
            if ran:
                spent += drafter_ms
                state.observe_round(1, model.cost(1), drafter_ms / 1000)
            verify = int(policy.verify_lens(proposal.rates, None, proposal.sources).clamp(1, proposal.tokens.shape[1] + 1)[0])
            longest = int(proposal.lengths[0]) if proposal.parents is not None else min(int(proposal.lengths[0]), budget - 1)
            g = max(0, min(verify - 1, longest))
            toks = proposal.tokens[0, :g].tolist()
            rest = truth[produced:]
            if spec.get("oracle"):  # verify exactly the longest agreeing prefix of any candidate: the bound for choosing
                best = 0
                for _, option_tokens, _ in proposer._options.get(r, ()):
                    k = 0
                    while k < min(len(option_tokens), budget - 1) and option_tokens[k] == rest[k]:
                        k += 1
                    best = max(best, k)
                g, path = best, list(range(1, best + 1))
            elif proposal.parents is not None:
                path = walk(toks, proposal.parents[0, :g].tolist(), g, rest)
            else:
                k = 0
                while k < g and k < len(rest) and toks[k] == rest[k]:
                    k += 1
                path = list(range(1, k + 1))
            chunk = rest[: len(path) + 1]
            proposer.record([r], [chunk])
            proposer.extend_row(r, chunk)
            produced += len(chunk)
            spent += model.cost(g + 1) * 1000 + ROUND_OVERHEAD_MS
            stats["verified"] += g
            stats["accepted"] += len(path)
            stats["failed_rounds"] += g > 0 and not path
            rounds += 1
        proposer.finish_row(r)
        d = per_domain.setdefault(row["domain"], [0, 0.0, 0])
        d[0] += produced - 1  # after the prefill
        d[1] += spent
        d[2] += rounds
    step = COSTS[1]
    out = {}
    for domain, (tokens, spent, rounds) in list(per_domain.items()) + [("all", [sum(v[i] for v in per_domain.values()) for i in range(3)])]:
        out[domain] = {"tau": tokens / rounds, "speedup": tokens * step / spent, "ms_per_round": spent / rounds}
    total_rounds = out["all"]["tau"] and sum(v[2] for v in per_domain.values())
    out["all"].update({k: v / total_rounds for k, v in stats.items()})
    return out


def main() -> None:
    if sys.argv[1] == "cache-train":
        cache_train(int(sys.argv[2]))
        return
    if sys.argv[1] == "cache-drafter":
        cache_drafter(sys.argv[2] if len(sys.argv) > 2 else "bf16", int(sys.argv[3]) if len(sys.argv) > 3 else 0)
        return
    if sys.argv[1] == "cache":
        cache(int(sys.argv[2]) if len(sys.argv) > 2 else 8, sys.argv[3] if len(sys.argv) > 3 else "bf16")
        return
    rows = json.loads(CACHE.read_text())
    for spec in sys.argv[2:]:
        res = simulate(rows, parse(spec))
        cells = "  ".join(f"{d} {v['speedup']:.3f}x tau {v['tau']:.2f}" for d, v in res.items())
        print(f"{spec:<40} {cells}  ({res['all']['ms_per_round']:.1f} ms/round; per round {res['all']['verified']:.2f} verified, {res['all']['accepted']:.2f} accepted, {res['all']['failed_rounds']:.2f} failed)", flush=True)


if __name__ == "__main__":
    main()
