"""What a run's config guarantees, stated without training: `privacy_statement(config)`.

The analogue of TF-Privacy's `compute_dp_sgd_privacy_statement` and Opacus' `get_epsilon` for
a fedjax_pals config: the mechanisms the run applies (DP on the model updates, DP on the label
marginals), their parameters as the run will use them, the (epsilon, delta) they spend, the
unit of privacy, and the assumptions in words.

The numbers are the training's own: the config is resolved by `resolve_config` (no data is
read: the clients are counted from the config, `partition.num_clients - 1`, a reader's from its
files' description), whose feature resolution already checks the budget, and the noise
multiplier and epsilon come from `fedjax_pals.algorithms.private_updates.budget_for`, the one
function a training run calls to calibrate sigma and account each round
(`fedjax_pals.accounting`: dp-accounting's accountant, its event and neighbouring relation).
What the statement says is therefore what the run's results.json records as `dp_epsilon` and
`dp_noise_multiplier`, and it follows any change of the accounting.

No data set is loaded, no partition drawn, no model built or compiled.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from typing import Any

from fedjax_pals import accounting, privacy
from fedjax_pals import sampling as sampling_lib
from fedjax_pals.algorithms import private_updates, registry
from fedjax_pals.data import dataset_label
from fedjax_pals.experiment.config import ResolvedConfig, as_dict, resolve_config

# dp-accounting's neighbouring relations, in words (the unit of privacy is one client).
_RELATIONS = {
    "REPLACE_SPECIAL": "one client's whole data set replaced by a special client that "
    "contributes nothing (zero-out), every S_i, n_i and the participation public and the "
    "weights held fixed",
    "ADD_OR_REMOVE_ONE": "adding or removing one client with its whole data set, the "
    "weights re-normalised over the others",
    "REPLACE_ONE": "one client's update replaced by any other, every S_i, n_i and the weights "
    "held fixed (which covers zero-out)",
}


@dataclasses.dataclass(frozen=True)
class UpdatesPrivacy:
    """DP on the model updates (user-level DP-FedAvg) as a run of the config applies it.

    Attributes:
      clip_norm: C, the L2 norm each participant's update is clipped to (the initial C under
        adaptive clipping).
      clip_quantile: adaptive clipping's gamma, or None (C fixed).
      noise_multiplier: sigma of each round's release (given, or calibrated).
      updates_noise_multiplier: the updates' own multiplier (sigma itself; lower under adaptive
        clipping, whose clipped count shares the release).
      calibrated: sigma was calibrated to `target_epsilon` (not given).
      target_epsilon: `algorithm.dp_target_epsilon`, or None.
      delta: the delta of (epsilon, delta).
      rounds: the rounds accounted (`training.rounds`).
      num_clients: M, the training clients.
      clients_per_round: m, the participants a round (Poisson sampling: the lanes a round runs).
      sampling: "every_client", "without_replacement" (m of M a round) or "poisson".
      sampling_rate: Poisson sampling's q, or None.
      accountant: the dp-accounting accountant ("rdp" or "pld", `algorithm.dp_accountant`).
      neighbouring_relation: `algorithm.dp_neighbouring_relation` as the run applies it:
        "zero_out" (noise sigma C max_i alpha_i) or "add_remove" (2 sigma C max_i alpha_i).
      neighbouring: the dp-accounting neighbouring relation the epsilon is for
        ("REPLACE_SPECIAL", "ADD_OR_REMOVE_ONE", "REPLACE_ONE").
      event: the dp-accounting event accounted, as text (None for sigma = 0).
      epsilon: the epsilon the run's rounds spend at `delta` (inf for sigma = 0): what the
        run's results.json records as `dp_epsilon`.
      clipping: where the updates are clipped (`algorithm.dp_clipping`): "server" (the server
        receives each raw update) or "client" (each client clips its own before sending it).
    """

    clip_norm: float
    clip_quantile: float | None
    noise_multiplier: float
    updates_noise_multiplier: float
    calibrated: bool
    target_epsilon: float | None
    delta: float
    rounds: int
    num_clients: int
    clients_per_round: int
    sampling: str
    sampling_rate: float | None
    accountant: str
    neighbouring_relation: str
    neighbouring: str | None
    event: str | None
    epsilon: float
    clipping: str = "server"

    @property
    def sensitivity_factor(self) -> float:
        """The aggregate's L2 sensitivity in units of C max_i alpha_i (1 or 2)."""
        return private_updates.SENSITIVITY_FACTOR[self.neighbouring_relation]


@dataclasses.dataclass(frozen=True)
class LabelPrivacy:
    """DP on the clients' label marginals S_i(Y) (`algorithm.label_dp_epsilon`).

    Attributes:
      epsilon, delta: the release's guarantee per training example (delta None: Laplace, pure
        epsilon-DP).
      mechanism: "laplace" or "gaussian".
      noise_std: the noise's standard deviation per label count.
    """

    epsilon: float
    delta: float | None
    mechanism: str
    noise_std: float


@dataclasses.dataclass(frozen=True)
class ClientLevelPrivacy:
    """Both mechanisms at the level of one client, where it is defined: label DP's release
    (epsilon_S-DP per example, Laplace) is n_i epsilon_S-DP for a client's n_i examples by
    group privacy (neighbours replace the client's examples, n_i fixed), and basic
    composition adds DP on updates' epsilon: (epsilon_updates + n_i epsilon_S, delta).

    Attributes:
      updates_epsilon, delta: DP on updates' (epsilon, delta).
      label_epsilon_per_example: epsilon_S, label DP's epsilon per example.
    """

    updates_epsilon: float
    delta: float
    label_epsilon_per_example: float

    def epsilon(self, num_examples: int) -> float:
        """The client-level epsilon of a client of `num_examples` examples (at `delta`)."""
        return self.updates_epsilon + num_examples * self.label_epsilon_per_example


@dataclasses.dataclass(frozen=True)
class PrivacyStatement:
    """What a run of the config guarantees (`privacy_statement`); `text()` says it in words.

    Attributes:
      method: the method's display name ("FedPALS").
      data: the data set and its clients, in words.
      updates: DP on the model updates, or None (not applied).
      labels: DP on the label marginals, or None (not applied).
      notes: remarks on the config (a DP key that does not apply to its method).
    """

    method: str
    data: str
    updates: UpdatesPrivacy | None
    labels: LabelPrivacy | None
    notes: tuple[str, ...] = ()

    @property
    def client_level(self) -> ClientLevelPrivacy | None:
        """Both mechanisms per client (`ClientLevelPrivacy`), where it is defined: DP on updates
        with a finite epsilon and Laplace label DP; None otherwise (no label DP: S_i is not
        protected; the Gaussian's group privacy over n_i examples multiplies its delta by up to
        n_i e^((n_i - 1) epsilon_S), which the statement does not state)."""
        u, l = self.updates, self.labels
        if u is None or l is None or l.mechanism != "laplace" or math.isinf(u.epsilon):
            return None
        return ClientLevelPrivacy(u.epsilon, u.delta, l.epsilon)

    @property
    def private(self) -> bool:
        """Some differential privacy is applied."""
        return self.updates is not None or self.labels is not None

    def as_dict(self) -> dict[str, Any]:
        """The statement as data for `json.dumps` (the text in "text"). An epsilon without a
        guarantee (sigma = 0) stays `inf`, which strict JSON lacks: `experiments.privacy
        --json` writes it as null."""
        return {
            "method": self.method, "data": self.data,
            "updates": None if self.updates is None else dataclasses.asdict(self.updates),
            "labels": None if self.labels is None else dataclasses.asdict(self.labels),
            "client_level": (None if self.client_level is None
                             else dataclasses.asdict(self.client_level)),
            "notes": list(self.notes), "text": self.text(),
        }

    def text(self) -> str:
        """The statement in words: the mechanisms, the (epsilon, delta), the unit of privacy
        and the assumptions."""
        lines = [f"Privacy statement: {self.method} on {self.data}.", ""]
        if not self.private:
            lines += [
                "No differential privacy is applied (algorithm.dp_clip_norm and "
                "algorithm.label_dp_epsilon are unset): the server sees every participant's exact "
                "model update and every client's exact label distribution.",
            ]
            lines += [f"Note: {n}" for n in self.notes]
            return "\n".join(_wrapped(line) for line in lines) + "\n"
        if self.updates is not None:
            lines += _updates_text(self.updates) + [""]
        else:
            lines += ["DP on model updates: not applied (algorithm.dp_clip_norm is unset); the "
                      "server sees every participant's exact update.", ""]
        if self.labels is not None:
            lines += _labels_text(self.labels) + [""]
        else:
            lines += ["DP on label marginals: not applied; the server's weights read the exact "
                      "S_i: the clients' label distributions are not protected.", ""]
        if self.client_level is not None:
            c = self.client_level
            lines += [
                "Per client (both mechanisms, basic composition): (epsilon, delta) = "
                f"({_number(c.updates_epsilon)} + n_i x {c.label_epsilon_per_example:g}, "
                f"{c.delta:g}) for a client of n_i examples (label DP's release is "
                f"{c.label_epsilon_per_example:g} n_i-DP for its n_i examples by group "
                "privacy).", ""]
        lines += ["Assumptions:"] + [f"* {a}" for a in self._assumptions()]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(_wrapped(line) for line in lines) + "\n"

    def _assumptions(self) -> list[str]:
        said = []
        if self.updates is not None and self.updates.event is None:
            said.append("sigma = 0: the updates are clipped but not noised, and nothing the "
                        "server learns from them is private.")
        elif self.updates is not None:
            u = self.updates
            if u.sampling == "poisson":
                drawn = f"each client independently with probability {u.sampling_rate:g} a round."
            elif u.sampling == "every_client":
                drawn = "every training client takes part in every round."
            else:
                drawn = (f"{u.clients_per_round} of the {u.num_clients} uniformly at random "
                         "without replacement, independently each round.")
            scale = "2 sigma C max_i alpha_i" if u.neighbouring_relation == "add_remove" else (
                "sigma C max_i alpha_i")
            trust = (
                "Central DP: the server receives every participant's raw update and clips it "
                "itself, so it is trusted; " if u.clipping == "server" else
                "Central DP with client-side clipping: each client clips its own update before "
                "sending it, so the server never receives a raw update, but it receives each "
                "clipped update unnoised and adds the noise itself, so it is trusted with "
                "those; ")
            said += [
                trust + "the guarantee is for what it releases (each round's noised aggregate, "
                "hence every intermediate global model), not only the final model.",
                "Public inputs: every client's size n_i and label distribution S_i"
                + (" (their DP release)" if self.labels else "")
                + ", T and which clients take part are inputs to the weights alpha and to the "
                f"noise's scale {scale}" + (" / q over every client (the fixed-denominator "
                                            "estimator)" if u.sampling == "poisson" else "")
                + "; the relation holds them fixed, so the guarantee says nothing about them"
                + ("." if self.labels else
                   " (no label DP: S_i is not protected)."),
                f"The clients are drawn as accounted: {drawn}",
                "A client's whole data set is the unit: the epsilon bounds what the releases "
                "tell about any one client's training data, not per example.",
            ]
        if self.labels is not None:
            said.append(
                "Label DP is per training example (neighbouring data sets replace one example, "
                "so n_i is public); each client releases its label counts once, before "
                "training, and everything the server derives from them is post-processing."
            )
        if self.updates is not None and self.labels is not None and self.client_level is None:
            said.append(
                "The two guarantees are for different units and no client-level sum is stated: "
                "group privacy of the Gaussian label release over a client's n_i examples "
                "multiplies its delta by up to n_i e^((n_i - 1) epsilon_S)."
                if self.labels.mechanism == "gaussian" else
                "The two guarantees are for different units, and DP on updates spends no finite "
                "epsilon: no client-level sum is stated."
            )
        said.append(
            "This is a simulation on one machine: results.json (the experimenter's record, "
            "not the server's) holds the exact label counts and per-run data."
        )
        return said


_WIDTH = 96


def _wrapped(line: str) -> str:
    """A line of the statement wrapped at `_WIDTH` columns, continuation lines indented under
    its text (a "  key:   value" line's value, a bullet's text)."""
    if len(line) <= _WIDTH:
        return line
    if line.startswith("  ") and ":" in line:
        head = line.index(":") + 1
        indent = head + len(line[head:]) - len(line[head:].lstrip())
    else:
        indent = 2 if line.startswith("* ") else 0
    return textwrap.fill(line, _WIDTH, subsequent_indent=" " * indent,
                         break_long_words=False, break_on_hyphens=False)


def _number(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.4g}"


def _updates_text(u: UpdatesPrivacy) -> list[str]:
    clip = (f"clipped to L2 norm C = {u.clip_norm:g}"
            + (" by each client before it is sent" if u.clipping == "client" else "")
            if u.clip_quantile is None else
            f"clipped to C, starting at {u.clip_norm:g} and following the {u.clip_quantile:g} "
            "quantile of the update norms (adaptive clipping; the clipped count is released "
            f"within the same sigma, the updates' own multiplier is "
            f"{_number(u.updates_noise_multiplier)})")
    how = (f"calibrated to epsilon {u.target_epsilon:g} at delta {u.delta:g} over the run's "
           f"{u.rounds} rounds" if u.calibrated else "given")
    if u.target_epsilon is not None and not u.calibrated:
        how += f", within the budget epsilon {u.target_epsilon:g}"
    if u.sampling == "poisson":
        sampling = (f"each of the {u.num_clients} training clients with probability "
                    f"q = {u.sampling_rate:g} a round (Poisson sampling; {u.clients_per_round} "
                    "lanes)")
    elif u.sampling == "every_client":
        sampling = f"all {u.num_clients} training clients every round"
    else:
        sampling = (f"{u.clients_per_round} of the {u.num_clients} training clients a round, "
                    "drawn without replacement")
    scale = "2 sigma C max_i alpha_i" if u.neighbouring_relation == "add_remove" else (
        "sigma C max_i alpha_i")
    lines = [
        "DP on model updates (user-level DP-FedAvg):",
        f"  mechanism:    each participant's update {clip}; the weighted aggregate plus "
        + (f"N(0, ({scale} / q)^2) per coordinate, alpha the weights over every "
           "client" if u.sampling == "poisson" else
           f"N(0, ({scale})^2) per coordinate"),
        f"  noise:        multiplier sigma = {_number(u.noise_multiplier)} ({how})",
        f"  rounds:       {u.rounds}",
        f"  clients:      {sampling}",
    ]
    if u.event is None:
        lines += [
            "  accounting:   none: sigma = 0 clips without noise",
            f"  guarantee:    none (epsilon = inf at delta = {u.delta:g})",
        ]
        return lines
    lines += [
        f"  accounting:   dp-accounting's {u.accountant.upper()} accountant, neighbouring "
        f"federations differ by {_RELATIONS.get(u.neighbouring, u.neighbouring)} "
        f"({u.neighbouring}; algorithm.dp_neighbouring_relation = "
        f"{u.neighbouring_relation}); the event {u.event}",
        f"  unit:         one client's whole data set (user-level)",
        f"  guarantee:    (epsilon, delta) = ({_number(u.epsilon)}, {u.delta:g}) over "
        f"{u.rounds} rounds",
    ]
    return lines


def _labels_text(l: LabelPrivacy) -> list[str]:
    if l.mechanism == "laplace":
        mechanism = (f"Laplace noise of scale {l.noise_std / math.sqrt(2):.4g} (std "
                     f"{l.noise_std:.4g}) on each of the K label counts")
        guarantee = f"epsilon = {l.epsilon:g} (pure epsilon-DP)"
    else:
        mechanism = (f"Gaussian noise of std {l.noise_std:.4g} (the analytic calibration) on "
                     "each of the K label counts")
        guarantee = f"(epsilon, delta) = ({l.epsilon:g}, {l.delta:g})"
    return [
        "DP on label marginals (the clients' S_i(Y), released once before training):",
        f"  mechanism:    {mechanism}; projected onto the simplex",
        "  unit:         one training example (neighbours replace one example: L1 "
        "sensitivity 2, L2 sqrt(2))",
        f"  guarantee:    {guarantee} per example, for the whole federation's release "
        "(parallel composition: each client releases once)",
    ]


def _settings(name: str, algorithm: Any) -> Any:
    """The feature's hyperparameters in the resolved section, as the run's task reads them
    (None: off)."""
    (feature,) = [f for f in registry.registered_features() if f.name == name]
    return feature.settings(algorithm)


def _updates(algorithm: Any, training: Any, num_clients: int) -> UpdatesPrivacy | None:
    hp = _settings("dp_updates", algorithm)
    if hp is None:
        return None
    # How the run's client sampler is accounted (its `accounting()`: the training's own).
    per_round, rate = private_updates.accounted_sampling(
        sampling_lib.sampler_for(training, num_clients), num_clients,
        training.clients_per_round or num_clients, None)
    rounds = int(training.rounds)
    # The training's own calibration and accounting (`budget` of the built task).
    spent = private_updates.budget_for(hp, num_clients, per_round, rounds, sampling_rate=rate)
    sigma = spent.noise_multiplier
    updates_sigma = sigma
    if hp.dp_clip_quantile is not None:
        updates_sigma = private_updates.updates_noise_multiplier(
            sigma, private_updates.COUNT_STD_PER_PARTICIPANT * per_round)
    event = relation = None
    if sigma > 0:
        dp_event, dp_relation = accounting.updates_dp_event(
            sigma, rounds, num_clients=num_clients, clients_per_round=per_round,
            sampling_rate=rate, relation=spent.relation)
        event, relation = str(dp_event), dp_relation.name
    sampling = ("poisson" if rate is not None else
                "every_client" if per_round == num_clients else "without_replacement")
    return UpdatesPrivacy(
        clip_norm=float(hp.dp_clip_norm), clip_quantile=hp.dp_clip_quantile,
        noise_multiplier=float(sigma), updates_noise_multiplier=float(updates_sigma),
        calibrated=spent.calibrated, target_epsilon=hp.dp_target_epsilon, delta=spent.delta,
        rounds=rounds, num_clients=num_clients, clients_per_round=per_round, sampling=sampling,
        sampling_rate=rate, accountant=spent.accountant,
        neighbouring_relation=spent.relation, neighbouring=relation, event=event,
        epsilon=float(spent.epsilon(rounds)), clipping=hp.clipping,
    )


def _labels(algorithm: Any) -> LabelPrivacy | None:
    hp = _settings("label_dp", algorithm)
    if hp is None:
        return None
    epsilon, mechanism, delta = hp.label_dp_epsilon, hp.label_dp_mechanism, hp.label_dp_delta
    scale = privacy.noise_scale(epsilon, mechanism, delta=delta)
    std = math.sqrt(2.0) * scale if mechanism == "laplace" else scale
    return LabelPrivacy(float(epsilon), delta, mechanism, float(std))


def privacy_statement(config: Any) -> PrivacyStatement:
    """What a run of `config` guarantees, without training (module docstring).

    The noise multiplier (given, or calibrated to `algorithm.dp_target_epsilon` exactly as the
    run calibrates it) and the epsilon come from the same accountant function the training
    calls (`private_updates.budget_for`, `fedjax_pals.accounting`), so they equal the run's
    results.json `dp_noise_multiplier` and `dp_epsilon`. The config is validated and resolved
    (`resolve_config`); no data is loaded, no model built.

    Args:
      config: a run's config (a ConfigDict, a mapping laid over `default_config()`, or a
        `ResolvedConfig`); not a sweep's.

    Returns:
      A `PrivacyStatement`; `.text()` says it in words, `.as_dict()` as data, `.private` is
      False for a config without DP.

    Raises:
      ConfigError: a bad config, one whose budget no noise multiplier meets, or a sweep's.
    """
    given = {} if isinstance(config, ResolvedConfig) else as_dict(config)
    resolved = resolve_config(config)
    c = resolved.config
    num_clients = int(c.partition.num_clients) - 1  # the last client is the target
    data = f"{dataset_label(c.dataset.name)}, {num_clients} training clients"
    notes = []
    asked = (given.get("algorithm") or {}).get("label_dp_epsilon")
    if asked is not None and c.algorithm.label_dp_epsilon is None:
        notes.append(
            f"algorithm.label_dp_epsilon={asked!r} is set, but {resolved.label}'s server weights "
            "read no label distribution: nothing is released, and the key has no effect."
        )
    return PrivacyStatement(
        method=resolved.label, data=data, updates=_updates(c.algorithm, c.training, num_clients),
        labels=_labels(c.algorithm), notes=tuple(notes),
    )
