"""Chapter 7's learner-style mutants (see tests/machinery/mutants/__init__.py).

Not here because no test can see them (RoPE's scores depend on offsets only): positions counted
from 1 in LlamaTransformer.forward or in the cache, or over the padding of a left-padded batch,
shift every query and key of a row alike and give the same logits. The chapter says so."""

from tests.machinery.mutants import Mutant

MUTANTS = [
    # rmsnorm
    Mutant(
        "rmsnorm",
        "x = residual.float()",
        "x = residual.float()\n        x = x - x.mean(dim=-1, keepdim=True)",
        "the mean subtracted, as LayerNorm does",
        says=("subtracts the mean",),
    ),
    Mutant(
        "rmsnorm",
        "inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)",
        "inv_rms = 1 / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.cfg.rms_norm_eps)",
        "epsilon outside the square root",
        says=("epsilon", "inside the sqrt"),
    ),
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms).to(residual.dtype)",
        "return (x * inv_rms).to(residual.dtype)",
        "the weight forgotten",
        says=("self.w",),
    ),
    Mutant(
        "rmsnorm",
        "x = residual.float()",
        "x = residual",
        "the mean square taken in the input's dtype: float16 overflows",
        says=("float32", "overflow"),
    ),
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True)",
        "x.pow(2).sum(dim=-1, keepdim=True)",
        "the sum of squares where their mean belongs",
        says=("sum",),
    ),
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True)",
        "x.pow(2).mean(dim=1, keepdim=True)",
        "the mean square taken over the positions axis",
        says=("positions axis",),
    ),
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True)",
        "x.pow(2).mean(dim=-1)",
        "the mean square without keepdim: it does not broadcast against the vector",
        says=("keepdim",),
    ),
    Mutant(
        "rmsnorm",
        "+ self.cfg.rms_norm_eps)",
        "+ 1e-5)",
        "epsilon written as 1e-5 instead of read from the config",
        says=("cfg.rms_norm_eps", "constant"),
    ),
    Mutant(
        "rmsnorm",
        "torch.rsqrt(",
        "torch.sqrt(",
        "multiplied by the root mean square instead of divided",
        says=("multiply by the root mean square",),
    ),
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True)",
        "x.var(dim=-1, keepdim=True)",
        "the variance (mean subtracted) where the mean square belongs",
        says=("variance",),
    ),
    # rope
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = torch.arange(0, d_head // 2, device=positions.device).float() / d_head",
        "the exponent i/d instead of 2i/d",
        says=("2i",),
    ),
    Mutant(
        "rope",
        "angles = torch.cat([angles, angles], dim=-1)",
        "angles = angles.repeat_interleave(2, dim=-1)",
        "the angles in the interleaved layout where the half-split one is wanted",
        says=("interleaved", "half-split"),
    ),
    Mutant(
        "rope",
        "inv_freq = 1.0 / theta**exponents",
        "inv_freq = 1.0 / 10000.0**exponents",
        "theta written as 10000 instead of read from the argument",
        says=("theta = 10000",),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = torch.arange(0, d_head, 2).float() / d_head",
        "the frequencies made on the CPU whatever the positions' device",
        says=("device",),
    ),
    Mutant(
        "rope",
        "angles = positions.float()[..., None] * inv_freq",
        "angles = (positions.float() + 1)[..., None] * inv_freq",
        "positions counted from 1",
        says=("next position",),
    ),
    Mutant(
        "rope",
        "return x * cos + rotate_half(x) * sin",
        "return x * cos - rotate_half(x) * sin",
        "turning the wrong way",
        says=("wrong way",),
    ),
    Mutant(
        "rope",
        "return x * cos + rotate_half(x) * sin",
        "pairs = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)\n"
        "    return x * cos + pairs * sin",
        "neighbouring coordinates turned together (the paper's layout) with HF's angles",
        says=("(2i, 2i + 1)", "half-split"),
    ),
    Mutant(
        "rope",
        "inv_freq = 1.0 / theta**exponents",
        "inv_freq = theta**exponents",
        "frequencies theta ** (2i/d), not one over it: later pairs turn faster",
        says=("one over",),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / (d_head // 2)",
        "the exponent 2i over d_head / 2",
        says=("4i",),
    ),
    Mutant(
        "rope",
        "cos, sin = cos[:, None], sin[:, None]",
        "cos, sin = cos, sin",
        "cos and sin given no axis for the heads",
        says=("axis of size 1 for the heads",),
    ),
    Mutant(
        "rope",
        "cos, sin = cos[:, None], sin[:, None]",
        "cos, sin = cos[:, :, None], sin[:, :, None]",
        "the heads axis added after the positions",
        says=("axis of size 1 for the heads", "at axis 1"),
    ),
    # swiglu
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return ((x @ self.W_gate) * F.silu(x @ self.W_up)) @ self.W_down",
        "SiLU on the up branch instead of the gate",
        says=("silu", "gate"),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.gelu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "GELU where SiLU belongs",
        says=("gelu", "silu"),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return F.silu((x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "SiLU on the product",
        says=("product",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (torch.sigmoid(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "a sigmoid gate (GLU) where SiLU belongs",
        says=("sigmoid", "silu"),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.relu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "a ReLU gate (ReGLU) where SiLU belongs",
        says=("relu", "silu"),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu(x @ self.W_gate) + (x @ self.W_up)) @ self.W_down",
        "the branches added instead of multiplied",
        says=("added",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return F.linear(F.silu(F.linear(x, self.W_gate)) * F.linear(x, self.W_up), self.W_down)",
        "the weights applied as HF's [out, in] layout (F.linear)",
        says=("[in, out]",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return F.silu(x @ self.W_gate) * (x @ self.W_up)",
        "no down projection",
        says=("W_down",),
    ),
    # expand_kv
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.repeat(1, group_size, 1, 1)",
        "the copies tiled: the wrong query heads share each key/value head",
        says=("consecutive",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.repeat_interleave(group_size, dim=2)",
        "repeated along the positions axis",
        says=("heads axis",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "b, n, p, d = kv.shape\n"
        "    return kv[..., None].expand(b, n, p, d, group_size).reshape(b, n * group_size, p, d)",
        "copies made on a new last axis, then reshaped: the heads mixed with d_head",
        says=("not a copy",),
    ),
    # gqa
    Mutant(
        "gqa",
        "return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v",
        "return apply_rope(q, cos, sin), k, v",
        "the keys never rotated",
        says=("keys are not rotated",),
    ),
    Mutant(
        "gqa",
        "return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v",
        "return apply_rope(q, cos, sin), apply_rope(k, cos, sin), apply_rope(v, cos, sin)",
        "the values rotated too",
        says=("values are rotated",),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(\n"
        "            q, keys, values, attn_mask=allowed, scale=self.cfg.d_model**-0.5\n"
        "        )",
        "scores scaled by 1/sqrt(d_model)",
        says=("sqrt(d_model)", "sqrt(d_head)"),
    ),
    Mutant(
        "gqa",
        "keys = expand_kv(keys, self.cfg.group_size)\n"
        "        values = expand_kv(values, self.cfg.group_size)",
        "keys = keys.repeat(1, self.cfg.group_size, 1, 1)\n"
        "        values = values.repeat(1, self.cfg.group_size, 1, 1)",
        "keys and values tiled in attend: the wrong query heads share them",
        says=("consecutive query heads",),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, is_causal=True)",
        "a causal mask of its own (is_causal) instead of `allowed`: wrong with a cache",
        says=("does not use `allowed`",),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values)",
        "no mask: every query reads later positions",
        says=("every query reads every key",),
    ),
    Mutant(
        "gqa",
        'return einops.einsum(z, self.W_O, "b h p e, h e d -> b p d")',
        "return z.reshape(z.shape[0], z.shape[2], -1) @ self.W_O.flatten(0, 1)",
        "the heads' outputs reshaped without moving the heads axis",
        says=("reshaped",),
    ),
    Mutant(
        "gqa",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)",
        "cos, sin = rope_cos_sin(\n"
        "            torch.arange(x.shape[1], device=x.device).expand(x.shape[:2]),\n"
        "            self.cfg.d_head,\n"
        "            self.cfg.rope_theta,\n"
        "        )",
        "angles from positions made afresh from 0, the given ones ignored",
        says=("started at 0",),
    ),
    Mutant(
        "gqa",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)",
        "cos, sin = rope_cos_sin(positions[:1], self.cfg.d_head, self.cfg.rope_theta)",
        "the first row's positions for every row",
        says=("first row's positions",),
    ),
    Mutant(
        "gqa",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_head, 10000.0)",
        "theta written as 10000 instead of the model's rope_theta",
        says=("theta = 10000",),
    ),
    # llama
    Mutant(
        "llama",
        "return resid_mid + self.mlp(self.ln2(resid_mid))",
        "return resid_mid + self.mlp(self.ln2(resid_pre))",
        "the MLP reads the residual stream from before the attention",
        says=("before the attention",),
    ),
    Mutant(
        "llama",
        "return self.unembed(self.ln_final(residual))",
        "return self.unembed(residual)",
        "no final RMSNorm",
        says=("final rmsnorm",),
    ),
    Mutant(
        "llama",
        "positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape)",
        "positions = torch.arange(tokens.shape[1]).expand(tokens.shape)",
        "the positions made on the CPU",
        says=("without a device",),
    ),
    Mutant(
        "llama",
        "positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape)",
        "positions = torch.arange(tokens.shape[1], device=tokens.device)",
        "positions [posn] handed to the blocks, not [batch, posn]",
        says=("[batch, posn]",),
    ),
    Mutant(
        "llama",
        "return resid_mid + self.mlp(self.ln2(resid_mid))",
        "return self.mlp(self.ln2(resid_mid))",
        "the MLP's output not added to the residual stream",
        says=("replaces the residual stream",),
    ),
    Mutant(
        "llama",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)\n"
        "        return resid_mid + self.mlp(self.ln2(resid_mid))",
        "resid_mid = self.ln1(resid_pre + self.attn(resid_pre, positions))\n"
        "        return self.ln2(resid_mid + self.mlp(resid_mid))",
        "a post-norm block",
        says=("post-norm",),
    ),
    Mutant(
        "llama",
        "return resid_mid + self.mlp(self.ln2(resid_mid))",
        "return resid_mid + self.mlp(self.ln1(resid_mid))",
        "ln1 reused before the MLP",
        says=("ln1 of resid_mid",),
    ),
    Mutant(
        "llama",
        "residual = self.embed(tokens)",
        "residual = self.embed(tokens) * self.cfg.d_model**0.5",
        "the embeddings scaled by sqrt(d_model)",
        says=("embeddings are scaled",),
    ),
    # llama_cache
    Mutant(
        "llama_cache",
        "positions = positions.expand(tokens.shape)",
        "positions = torch.arange(n_new, device=tokens.device).expand(tokens.shape)",
        "angles restarted at 0 after the prefill",
        says=("restarted",),
    ),
    Mutant(
        "llama_cache",
        "q, k, v = block.attn.rotated_qkv(x, positions)",
        "q, _, v = block.attn.rotated_qkv(x, positions)\n"
        '        k = einops.einsum(x, block.attn.W_K, "b p d, h d e -> b h p e")',
        "keys cached (and read) before rotation",
        says=("before rotation",),
    ),
    Mutant(
        "llama_cache",
        "k = torch.cat([past_k, k], dim=2)",
        "k = torch.cat([k, past_k], dim=2)",
        "the new keys put before the cached ones",
        says=("before the cached ones",),
    ),
    Mutant(
        "llama_cache",
        "positions = positions.expand(tokens.shape)",
        "positions = torch.arange(cache.length, cache.length + n_new).expand(tokens.shape)",
        "positions made on the CPU",
        says=("without a device",),
    ),
    Mutant(
        "llama_cache",
        "v = torch.cat([past_v, v], dim=2)",
        "v = torch.cat([v, past_v], dim=2)",
        "the new values put before the cached ones",
        says=("values were put before",),
    ),
    Mutant(
        "llama_cache",
        "keys.append(k)\n        values.append(v)",
        "keys.append(k[:, :, -n_new:])\n        values.append(v[:, :, -n_new:])",
        "only the new positions kept in the new cache",
        says=("not only the new tokens",),
    ),
    Mutant(
        "llama_cache",
        "block.attn.attend(q, k, v, allowed)",
        "block.attn.attend(q, k, v, None)",
        "the given mask dropped: the prefill reads later positions",
        says=("`allowed`",),
    ),
    Mutant(
        "llama_cache",
        "x = block.ln1(residual)",
        "x = residual",
        "the attention reads the residual stream without ln1",
        says=("ln1",),
    ),
    Mutant(
        "llama_cache",
        "residual = residual + block.attn.attend(q, k, v, allowed)\n"
        "        residual = residual + block.mlp(block.ln2(residual))",
        "attn_out = block.attn.attend(q, k, v, allowed)\n"
        "        residual = residual + attn_out + block.mlp(block.ln2(residual))",
        "the MLP reads the residual stream from before the attention",
        says=("before the attention",),
    ),
    Mutant(
        "llama_cache",
        "logits = model.unembed(model.ln_final(residual))",
        "logits = model.unembed(residual)",
        "no final RMSNorm",
        says=("final rmsnorm",),
    ),
    Mutant(
        "llama_cache",
        "positions = positions.expand(tokens.shape)",
        "positions = positions.expand(tokens.shape) + (cache.length > 0)",
        "the steps' positions one too far after the prefill",
        says=("1 too far",),
    ),
]
