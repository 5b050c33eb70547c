"""The tiny policy: padding does not change what it computes, sampling is seeded, token_stats has the protocol's shape."""

import torch

from rlstab.trainer.policy import Rollout
from rlstab.trainer.tasks import CharCodec
from rlstab.trainer.tiny_model import TinyConfig, TinyPolicy, response_mask_until_eos


def policy(seed=0):
    torch.manual_seed(seed)
    return TinyPolicy.create(CharCodec(), TinyConfig(vocab_size=CharCodec().vocab_size, d_model=32, n_layer=2, n_head=2, d_ff=64))


def test_left_padding_does_not_change_token_stats():
    p = policy()
    codec = p.codec
    prompts = [codec.encode("47+38="), codec.encode("123+456=")]
    response = torch.tensor([codec.encode("7+8=15") + [codec.eos_id]] * 2)
    mask = torch.ones_like(response, dtype=torch.bool)
    together, _ = p.token_stats(Rollout(prompts, response, mask))
    for i in range(2):
        alone, _ = p.token_stats(Rollout([prompts[i]], response[i : i + 1], mask[i : i + 1]))
        torch.testing.assert_close(together[i], alone[0], rtol=1e-5, atol=1e-5)


def test_padding_past_max_len_does_not_change_token_stats():
    # A DEEP-GRPO branch row: a long prompt (prompt + prefix) and a short suffix, padded to a response width that
    # would take the padding's positions past max_len (64): its real tokens' statistics are those of the row alone.
    p = policy()
    codec = p.codec
    prompt = codec.encode("12*34=" + "1" * 50)  # 56 tokens
    suffix = codec.encode("8") + [codec.eos_id]
    width = 12  # 56 + 12 = 68 > 64
    padded = torch.tensor([suffix + [codec.pad_id] * (width - len(suffix))])
    mask = response_mask_until_eos(padded, codec.eos_id)
    long, _ = p.token_stats(Rollout([prompt], padded, mask))
    alone, _ = p.token_stats(Rollout([prompt], torch.tensor([suffix]), torch.ones(1, len(suffix), dtype=torch.bool)))
    torch.testing.assert_close(long[0, : len(suffix)], alone[0], rtol=1e-5, atol=1e-5)


def test_sampling_is_seeded_and_matches_token_stats_under_greedy():
    p = policy()
    prompts = [p.codec.encode("12+34=")] * 3 + [p.codec.encode("99+1=")]
    a = p.sample(prompts, max_new_tokens=10, temperature=1.0, generator=torch.Generator().manual_seed(5))
    b = p.sample(prompts, max_new_tokens=10, temperature=1.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)

    greedy = p.sample(prompts, max_new_tokens=10, temperature=0.0, generator=torch.Generator())
    logprobs, entropy = p.token_stats(greedy)
    assert logprobs.shape == entropy.shape == greedy.response_ids.shape
    assert logprobs.requires_grad and not entropy.requires_grad
    # Greedy tokens are the argmax of the full forward pass too (the KV cache computes the same logits).
    with torch.no_grad():
        prompt_len = len(prompts[0])
        seq = torch.cat([torch.tensor(prompts[0]), greedy.response_ids[0]])[None]
        real = torch.ones_like(seq, dtype=torch.bool)
        from rlstab.trainer.tiny_model import _full_attention_mask, _positions

        logits, _ = p.model(seq, _positions(real), _full_attention_mask(real))
        n = int(greedy.response_mask[0].sum())
        assert torch.equal(logits[0, prompt_len - 1 : prompt_len - 1 + n].argmax(-1), greedy.response_ids[0, :n])


def test_response_mask_ends_at_first_eos():
    eos = CharCodec.eos_id
    ids = torch.tensor([[5, 6, eos, 0, 0], [5, eos, 7, eos, 0], [5, 6, 7, 8, 9]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(response_mask_until_eos(ids, eos), expected)


def test_default_model_is_about_a_million_parameters():
    torch.manual_seed(0)
    n = TinyPolicy.create(CharCodec()).num_parameters()
    assert 500_000 < n < 1_500_000


def test_token_distribution_is_token_stats_with_each_positions_sum_of_squared_probabilities():
    torch.manual_seed(0)
    codec = CharCodec()
    policy = TinyPolicy.create(codec, TinyConfig(vocab_size=codec.vocab_size, d_model=16, n_layer=1, n_head=2, d_ff=32))
    rollout = policy.sample([codec.encode("1+2="), codec.encode("30+4=")], max_new_tokens=4, temperature=1.0,
                            generator=torch.Generator().manual_seed(0))
    logprobs, entropy = policy.token_stats(rollout)
    same, same_entropy, squares = policy.token_distribution(rollout)
    assert torch.equal(logprobs, same) and torch.equal(entropy, same_entropy)
    # sum_j p_j^2 lies in [1/V, 1], and at least p_y^2 (the sampled token's own mass)
    assert bool((squares >= 1 / codec.vocab_size - 1e-6).all() and (squares <= 1 + 1e-6).all())
    assert bool((squares >= logprobs.detach().exp() ** 2 - 1e-6).all())
