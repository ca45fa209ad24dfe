"""Chapter 5's learner-style mutants: the Gumbel-max trick and the coupling probabilities (see
tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

MUTANTS: list[Mutant] = [
    # gumbel_sample: the temperature
    Mutant(
        "gumbel_sample",
        "(logits / temperature + gumbel)",
        "((logits + gumbel) / temperature)",
        "the temperature divides the noisy logits: samples at temperature 1 whatever T",
        name="temperature-after-noise",
    ),
    Mutant(
        "gumbel_sample",
        "(logits / temperature + gumbel)",
        "(logits * temperature + gumbel)",
        "the logits multiplied by the temperature",
        name="temperature-multiplied",
    ),
    Mutant(
        "gumbel_sample",
        "(logits / temperature + gumbel)",
        "(logits + gumbel / temperature)",
        "the noise divided by the temperature instead of the logits",
        name="temperature-on-noise",
    ),
    Mutant(
        "gumbel_sample",
        "    if temperature == 0:\n        return logits.argmax(dim=-1)",
        "",
        "temperature 0 not special-cased: logits / 0 gives inf and NaN",
        name="no-greedy",
    ),
    Mutant(
        "gumbel_sample",
        "return (logits / temperature + gumbel).argmax(dim=-1)",
        "logits /= temperature\n    return (logits + gumbel).argmax(dim=-1)",
        "the logits divided in place: the caller's tensor changes",
        name="in-place",
    ),
    # gumbel_sample: the noise
    Mutant(
        "gumbel_sample",
        "gumbel = -torch.log(-torch.log(u))",
        "gumbel = -torch.log(u)",
        "G = -log(U): exponential noise, not Gumbel",
        name="exponential-noise",
    ),
    Mutant(
        "gumbel_sample",
        "gumbel = -torch.log(-torch.log(u))",
        "gumbel = torch.log(-torch.log(u))",
        "G = log(-log U): the sign of the Gumbel noise flipped",
        name="noise-sign",
    ),
    Mutant(
        "gumbel_sample",
        "u = torch.rand(logits.shape, generator=generator, device=logits.device)",
        "u = torch.randn(logits.shape, generator=generator, device=logits.device)",
        "U drawn from a normal distribution (randn) instead of uniform",
        name="randn",
    ),
    Mutant(
        "gumbel_sample",
        "u = torch.rand(logits.shape, generator=generator, device=logits.device)",
        "u = torch.rand(logits.shape, device=logits.device)",
        "the generator not passed to torch.rand",
        name="no-generator",
    ),
    Mutant(
        "gumbel_sample",
        "u = torch.rand(logits.shape, generator=generator, device=logits.device)",
        "u = torch.rand(logits.shape[-1], generator=generator, device=logits.device)",
        "one noise vector shared by every row of the batch",
        name="noise-shared-by-rows",
    ),
    # gumbel_sample: the argmax
    Mutant(
        "gumbel_sample",
        "return (logits / temperature + gumbel).argmax(dim=-1)",
        "return (logits / temperature + gumbel).argmin(dim=-1)",
        "argmin instead of argmax",
        name="argmin",
    ),
    Mutant(
        "gumbel_sample",
        "return (logits / temperature + gumbel).argmax(dim=-1)",
        "return (logits / temperature + gumbel).argmax(dim=0)",
        "the argmax over the batch instead of the vocabulary",
        name="argmax-dim-0",
    ),
    Mutant(
        "gumbel_sample",
        "return (logits / temperature + gumbel).argmax(dim=-1)",
        "return (logits / temperature + gumbel).argmax(dim=-1).squeeze()",
        "squeeze() drops the batch dimension of a batch of one row",
        name="squeeze",
    ),
    Mutant(
        "gumbel_sample",
        "return (logits / temperature + gumbel).argmax(dim=-1)",
        "return (logits / temperature + gumbel).nan_to_num(neginf=0.0).argmax(dim=-1)",
        "-inf scores replaced by 0 to keep them finite: masked tokens can be sampled",
        name="masked-finite",
    ),
    # coupling: the shared-noise formula
    Mutant(
        "coupling",
        "ratios = torch.maximum(p[..., None, :] / p_k, q[..., None, :] / q_k)",
        "ratios = torch.minimum(p[..., None, :] / p_k, q[..., None, :] / q_k)",
        "min instead of max in the shared-noise formula",
        name="shared-min",
    ),
    Mutant(
        "coupling",
        "return torch.where(both, 1 / ratios.sum(dim=-1), 0.0).sum(dim=-1)",
        "return torch.where(both, 1 / ratios.sum(dim=-2), 0.0).sum(dim=-1)",
        "the inner sum over k instead of j (the wrong dimension of the ratio matrix)",
        name="shared-inner-dim",
    ),
    Mutant(
        "coupling",
        "return torch.where(both, 1 / ratios.sum(dim=-1), 0.0).sum(dim=-1)",
        "return torch.where(both, 1 / ratios.sum(dim=-1), 0.0).sum(dim=0)",
        "the outer sum over the first dimension instead of the vocabulary",
        name="shared-outer-dim",
    ),
    Mutant(
        "coupling",
        "    p_k = torch.where(both, p, 1.0)[..., :, None]\n"
        "    q_k = torch.where(both, q, 1.0)[..., :, None]\n"
        "    ratios = torch.maximum(p[..., None, :] / p_k, q[..., None, :] / q_k)  # [..., k, j]\n"
        "    return torch.where(both, 1 / ratios.sum(dim=-1), 0.0).sum(dim=-1)",
        "    ratios = torch.maximum(\n"
        "        p[..., None, :] / p[..., :, None], q[..., None, :] / q[..., :, None]\n"
        "    )\n"
        "    return (1 / ratios.sum(dim=-1)).sum(dim=-1)",
        "the formula as written, with no care for zeros: 0 / 0 gives NaN",
        name="shared-nan",
    ),
    Mutant(
        "coupling",
        "both = (p > 0) & (q > 0)",
        "both = (p > 0) | (q > 0)",
        "tokens possible under p OR q kept in the sum: 0 / 0 gives NaN",
        name="shared-or",
    ),
    Mutant(
        "coupling",
        "return torch.where(both, 1 / ratios.sum(dim=-1), 0.0).sum(dim=-1)",
        "return (1 / ratios.sum(dim=-1)).sum(dim=-1)",
        "terms of tokens impossible under p or q not dropped",
        name="shared-zeros-kept",
    ),
    Mutant(
        "coupling",
        "ratios = torch.maximum(p[..., None, :] / p_k, q[..., None, :] / q_k)",
        "ratios = torch.maximum(p_k / p[..., None, :], q_k / q[..., None, :])",
        "the ratios upside down: p_k / p_j instead of p_j / p_k",
        name="shared-inverted",
    ),
    # coupling: independent and rejection
    Mutant(
        "coupling",
        "return (p * q).sum(dim=-1)",
        "return torch.minimum(p, q).sum(dim=-1)",
        "independent draws given the rejection sampler's value, sum min(p, q)",
        name="independent-min",
    ),
    Mutant(
        "coupling",
        "return torch.minimum(p, q).sum(dim=-1)",
        "return (p * q).sum(dim=-1)",
        "the rejection sampler given the independent value, sum p q",
        name="rejection-product",
    ),
    Mutant(
        "coupling",
        "return torch.minimum(p, q).sum(dim=-1)",
        "return torch.maximum(p, q).sum(dim=-1)",
        "max instead of min for the rejection sampler",
        name="rejection-max",
    ),
    Mutant(
        "coupling",
        "return (p * q).sum(dim=-1)",
        "return (p * q).sum(dim=0)",
        "the independent sum over the first dimension instead of the vocabulary",
        name="independent-dim-0",
    ),
    Mutant(
        "coupling",
        "return torch.minimum(p, q).sum(dim=-1)",
        "return torch.minimum(p, q).sum()",
        "the rejection sum over everything: one number for the whole batch",
        name="rejection-sum-all",
    ),
    Mutant(
        "coupling",
        "return torch.minimum(p, q).sum(dim=-1)",
        "return p.clamp_(max=q).sum(dim=-1)",
        "min(p, q) written into p with clamp_: the caller's p changes",
        name="rejection-in-place",
    ),
]
