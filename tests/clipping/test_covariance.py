"""``rlstab.clipping.covariance``: Clip-Cov's and KL-Cov's centred products, over one micro-batch's valid tokens.

cov_t = (A_t - mean A) * (log pi_t - mean log pi) (Cui et al., arXiv 2505.22617), the means over valid tokens.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from rlstab.clipping.covariance import token_covariance

VALID = torch.tensor([[True, True, False], [True, False, False]])


def tokens(advantages, logprobs):
    return SimpleNamespace(valid_bool=VALID, valid=VALID.float(), advantages=torch.tensor(advantages),
                           logprobs=torch.tensor(logprobs))


def test_centred_products_by_hand():
    # A = 2, 2 | -1 on the valid tokens: mean 3 / 3 = 1 (over tokens; over responses it would be 0.5);
    # log pi = -1, -2 | -3: mean -2
    # (0, 0): (2 - 1) * (-1 + 2) = 1; (0, 1): (2 - 1) * (-2 + 2) = 0; (1, 0): (-1 - 1) * (-3 + 2) = 2
    t = tokens([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]], [[-1.0, -2.0, -7.0], [-3.0, -9.0, -9.0]])
    cov = token_covariance(t)
    assert cov.shape == (2, 3)
    assert cov[VALID].tolist() == pytest.approx([1.0, 0.0, 2.0], abs=1e-6)


def test_padding_never_moves_the_means():
    # the same valid tokens, padding NaN and infinite: the valid products are unchanged
    t = tokens([[2.0, 2.0, math.nan], [-1.0, math.inf, 5.0]], [[-1.0, -2.0, math.nan], [-3.0, -math.inf, 0.0]])
    assert token_covariance(t)[VALID].tolist() == pytest.approx([1.0, 0.0, 2.0], abs=1e-6)

