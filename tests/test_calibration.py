"""Bias-corrected temperature scaling: the fit is the float64 minimiser of the held-out NLL
(checked against SciPy), on the constraint beta >= 0 when the unconstrained one is not, and it
undoes a known miscalibration."""

import numpy as np
import pytest
from scipy import optimize, special

from fedjax_pals import calibration


def _nll(params, logits, labels, present):
    beta, bias = params[0], params[1:]
    scaled = np.where(present[None, :], beta * logits + bias[None, :], -np.inf)
    return -np.mean(special.log_softmax(scaled, axis=1)[np.arange(len(labels)), labels])


def _reference(logits, labels, present, beta_bounds=(None, None)):
    """The float64 minimiser of the same NLL by SciPy's L-BFGS-B (beta >= 0 as a bound), the
    bias of absent classes pinned to 0 (it does not enter the likelihood)."""
    k = logits.shape[1]
    bounds = [beta_bounds] + [(None, None) if p else (0.0, 0.0) for p in present]
    fit = optimize.minimize(
        _nll, np.r_[1.0, np.zeros(k)], args=(logits, labels, present), method="L-BFGS-B",
        bounds=bounds, options=dict(ftol=1e-15, gtol=1e-10, maxiter=10_000),
    )
    return fit.x, fit.fun


def _problem(rng, n=2000, k=5, beta=3.0):
    """Labels drawn from softmax(z) of random logits, shown to the fit as beta * z + shift:
    miscalibrated by a temperature 1/beta and a per-class offset."""
    z = rng.normal(size=(n, k)) * 1.5
    p = special.softmax(z, axis=1)
    labels = (p.cumsum(axis=1) < rng.random(n)[:, None]).sum(axis=1)
    return beta * z + rng.normal(size=k), labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fit_is_the_minimiser_of_the_held_out_nll(seed):
    rng = np.random.default_rng(seed)
    logits, labels = _problem(rng)
    present = np.ones(logits.shape[1], bool)
    fit = calibration.fit_bias_corrected_temperature(logits, labels)
    (beta, *bias), nll = _reference(logits, labels, present)
    # float32 logits and sums: the NLL agrees to ~1e-6 relative; the parameters to what the
    # curvature allows (the NLL is flat along b + c 1, so bias is compared up to its mean).
    assert fit.nll == pytest.approx(nll, rel=1e-5)
    assert _nll(np.r_[fit.beta, fit.bias], logits, labels, present) == pytest.approx(nll, rel=1e-5)
    assert fit.beta == pytest.approx(beta, rel=1e-3)
    np.testing.assert_allclose(fit.bias - fit.bias.mean(), np.subtract(bias, np.mean(bias)),
                               atol=5e-3)
    # It undoes the temperature the logits were given (beta = 3): 1/3 up to sampling noise.
    assert abs(fit.beta - 1 / 3) < 0.05
    assert fit.nll < fit.nll_uncalibrated


def test_a_model_worse_than_chance_gets_beta_zero_and_the_prior_as_bias():
    rng = np.random.default_rng(7)
    logits, labels = _problem(rng, beta=-2.0)  # logits anti-correlated with the labels
    fit = calibration.fit_bias_corrected_temperature(logits, labels)
    present = np.ones(logits.shape[1], bool)
    x, nll = _reference(logits, labels, present, beta_bounds=(0.0, None))
    assert fit.beta == 0.0 and x[0] == 0.0
    assert fit.nll == pytest.approx(nll, rel=1e-5)
    # At beta = 0 the posterior is softmax(b): the labels' empirical distribution.
    probs = calibration.calibrated_probabilities(fit, logits)
    np.testing.assert_allclose(
        probs[0], np.bincount(labels, minlength=5) / len(labels), atol=1e-4
    )


def test_a_class_without_held_out_examples_gets_probability_zero():
    rng = np.random.default_rng(3)
    logits, labels = _problem(rng, k=4)
    labels = np.where(labels == 2, 0, labels)  # no example of class 2
    fit = calibration.fit_bias_corrected_temperature(logits, labels)
    np.testing.assert_array_equal(fit.present, [True, True, False, True])
    _, nll = _reference(logits, labels, fit.present)
    assert fit.nll == pytest.approx(nll, rel=1e-5)
    probs = calibration.calibrated_probabilities(fit, logits)
    assert np.all(probs[:, 2] == 0.0)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-12)
    scaled = fit.beta * logits[:, [0, 1, 3]] + fit.bias[[0, 1, 3]]
    np.testing.assert_allclose(probs[:, [0, 1, 3]], special.softmax(scaled, axis=1), atol=1e-12)


def test_bad_inputs_are_refused():
    logits = np.zeros((4, 3))
    with pytest.raises(ValueError, match="logits must be an"):
        calibration.fit_bias_corrected_temperature(np.zeros(4), [0, 1, 2, 0])
    with pytest.raises(ValueError, match="finite"):
        calibration.fit_bias_corrected_temperature(np.full((4, 3), np.nan), [0, 1, 2, 0])
    with pytest.raises(ValueError, match="labels must lie"):
        calibration.fit_bias_corrected_temperature(logits, [0, 1, 3, 0])
    with pytest.raises(ValueError, match="integers"):
        calibration.fit_bias_corrected_temperature(logits, [0.0, 1.0, 2.0, 0.0])
    fit = calibration.fit_bias_corrected_temperature(logits, [0, 1, 2, 0])
    with pytest.raises(ValueError, match="classes"):
        calibration.calibrated_probabilities(fit, np.zeros((2, 4)))
