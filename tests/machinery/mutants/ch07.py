"""Chapter 7's learner-style mutants (see tests/machinery/mutants/__init__.py).

Not here because no test can see them (RoPE's scores depend on offsets only): positions counted
from 1 in LlamaTransformer.forward, which shift every query and key of a row alike and give the
same logits. The chapter says so. In the cache the same shift does show: the cached keys are
compared with HF's, rotated by positions counted from 0 (the mutant "positions from 1" below)."""

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
    Mutant(
        "rmsnorm",
        "mean(dim=-1, keepdim=True)",
        "mean(dim=2, keepdim=True)",
        "the mean square over axis 2, which 2-D input (chapter 8's runner) lacks",
        says=("2-d input", "from the end"),
    ),
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms).to(residual.dtype)",
        "return self.w * (x * inv_rms)",
        "the normalised vector not cast back: 16-bit input comes out float32",
        says=("returns torch.float32", "input's dtype"),
    ),
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms).to(residual.dtype)",
        "return (self.w * x * inv_rms).to(residual.dtype)",
        "the weight multiplied in float32, before the cast back",
        says=("one rounding off", "first"),
    ),
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms).to(residual.dtype)",
        "return (1 + self.w) * (x * inv_rms).to(residual.dtype)",
        "Gemma's (1 + w) in place of Llama's w",
        says=("(1 + w)",),
    ),
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True)",
        "x.pow(2).mean()",
        "one mean square for the whole tensor",
        says=("whole tensor",),
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
        "cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)",
        "cos, sin = cos.to(x.dtype), sin.to(x.dtype)",
        "cos and sin given no axis for the heads",
        says=("axis of size 1 for the heads",),
    ),
    Mutant(
        "rope",
        "cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)",
        "cos, sin = cos[:, :, None].to(x.dtype), sin[:, :, None].to(x.dtype)",
        "the heads axis added after the positions",
        says=("axis of size 1 for the heads", "at axis 1"),
    ),
    Mutant(
        "rope",
        "return angles.cos(), angles.sin()",
        "return angles.cos(), -angles.sin()",
        "the sines negated, the cosines right",
        says=("your cos equals", "your sin does not"),
    ),
    Mutant(
        "rope",
        "angles = positions.float()[..., None] * inv_freq",
        "angles = positions.half()[..., None] * inv_freq.half()",
        "the angles computed in float16",
        says=("float16",),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = torch.arange(1, d_head, 2, device=positions.device).float() / d_head",
        "the exponent (2i + 1)/d",
        name="exponent-2i-plus-1",
        says=("(2i + 1)",),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = torch.arange(0, d_head + 1, 2, device=positions.device).float() / d_head",
        "one frequency too many (d_head/2 + 1 pairs)",
        says=("one frequency each",),
    ),
    Mutant(
        "rope",
        "angles = torch.cat([angles, angles], dim=-1)",
        "angles = torch.cat([angles, angles], dim=-2)",
        "the two copies of the angles joined along the positions axis",
        says=("along the last axis",),
    ),
    Mutant(
        "rope",
        "return x * cos + rotate_half(x) * sin",
        "return x.float() * cos.float() + rotate_half(x).float() * sin.float()",
        "the rotation in float32 whatever x's dtype: bfloat16 queries come out float32",
        says=("returns torch.float32", "input's dtype"),
    ),
    Mutant(
        "rope",
        "return x * cos + rotate_half(x) * sin",
        "return rotate_half(x) * cos + x * sin",
        "the cosines on rotate_half(x), the sines on x",
        says=("x goes with the cosines",),
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
    Mutant(
        "gqa",
        "keys = expand_kv(keys, self.cfg.group_size)\n"
        "        values = expand_kv(values, self.cfg.group_size)",
        "keys = expand_kv(keys, self.cfg.n_kv_heads)\n"
        "        values = expand_kv(values, self.cfg.n_kv_heads)",
        "each key/value head copied n_kv_heads times, not group_size times",
        says=("group_size", "copied n_kv_heads = 2 times"),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, "
        "scale=1 / self.cfg.d_head)",
        "scores divided by d_head, not its root",
        says=("divided by d_head",),
    ),
    Mutant(
        "gqa",
        "q, k, v = project(self.W_Q), project(self.W_K), project(self.W_V)",
        "q, k, v = project(self.W_Q), project(self.W_V), project(self.W_K)",
        "keys projected with W_V and values with W_K",
        says=("keys are the projection through w_v",),
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
    Mutant(
        "llama",
        "return self.unembed(self.ln_final(residual))",
        "return self.ln_final(residual) @ self.embed.W_E.T",
        "logits from W_E transposed: the untied self.unembed ignored",
        says=("untied", "unembed"),
    ),
    Mutant(
        "llama",
        "return self.unembed(self.ln_final(residual))",
        "return self.ln_final(residual) @ self.embed.W_E",
        "logits from W_E as it is, untransposed",
        says=("as it is", "self.unembed"),
    ),
    Mutant(
        "llama",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)\n"
        "        return resid_mid + self.mlp(self.ln2(resid_mid))",
        "resid_mid = resid_pre + self.attn(self.ln2(resid_pre), positions)\n"
        "        return resid_mid + self.mlp(self.ln1(resid_mid))",
        "the two norms swapped",
        says=("attention reads ln2",),
    ),
    Mutant(
        "llama",
        "positions = torch.arange(tokens.shape[1], device=tokens.device)",
        "positions = torch.arange(tokens.shape[0], device=tokens.device)",
        "the positions counted along the batch axis",
        says=("number of positions",),
    ),
    Mutant(
        "llama",
        "residual = block(residual, positions)",
        "residual = residual + block(residual, positions)",
        "each block's output added to the residual stream again",
        says=("already returns the whole residual stream",),
    ),
    Mutant(
        "llama",
        "for block in self.blocks:",
        "for block in self.blocks[:-1]:",
        "the last block skipped",
        says=("never runs block 3",),
    ),
    Mutant(
        "llama",
        "residual = self.embed(tokens)",
        "residual = self.embed(tokens).float()",
        "the residual stream made float32 whatever the model's dtype",
        says=("is handed torch.float32",),
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
        # Made afresh from the cache's length, these also count a row's padding: the cached keys
        # of a left-padded row show that first (the device test comes after the logits' tests).
        says=("count the padding",),
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
    Mutant(
        "llama_cache",
        "positions = positions.expand(tokens.shape)",
        "positions = positions",
        "the caller's positions [new] (chapter 6's lookahead) not expanded to [batch, new]",
        says=("[new]", "[batch, new]"),
    ),
    Mutant(
        "llama_cache",
        "keys, values = [], []",
        "keys, values = list(cache.keys), list(cache.values)",
        "the lists started with the old cache's tensors",
        says=("one per layer",),
    ),
    Mutant(
        "llama_cache",
        "k = torch.cat([past_k, k], dim=2)\n        v = torch.cat([past_v, v], dim=2)",
        "k = torch.cat([past_k, k], dim=1)\n        v = torch.cat([past_v, v], dim=1)",
        "the cached and new keys joined along the heads axis",
        name="joined-along-heads",
        says=("axis 1 (heads)", "positions axis"),
    ),
    Mutant(
        "llama_cache",
        "k = torch.cat([past_k, k], dim=2)\n        v = torch.cat([past_v, v], dim=2)",
        "k = torch.cat([past_k, k], dim=-1)\n        v = torch.cat([past_v, v], dim=-1)",
        "the cached and new keys joined along d_head",
        name="joined-along-d-head",
        says=("axis 3 (d_head)", "positions axis"),
    ),
    Mutant(
        "llama_cache",
        "positions = positions.expand(tokens.shape)",
        "positions = positions.expand(tokens.shape) + 1",
        "positions from 1: the cached keys are turned one position too far",
        name="positions-from-1",
        says=("rotated by the angles of position 1",),
    ),
    Mutant(
        "llama_cache",
        "logits = model.unembed(model.ln_final(residual))",
        "logits = model.ln_final(residual) @ model.embed.W_E.T",
        "logits from W_E transposed: an untied model's unembed ignored",
        says=("model.unembed",),
    ),
    Mutant(
        "llama_cache",
        "k = torch.cat([past_k, k], dim=2)\n"
        "        v = torch.cat([past_v, v], dim=2)\n"
        "        residual = residual + block.attn.attend(q, k, v, allowed)",
        "residual = residual + block.attn.attend(q, k, v, allowed)\n"
        "        k = torch.cat([past_k, k], dim=2)\n"
        "        v = torch.cat([past_v, v], dim=2)",
        "attention before the cache is joined: the new queries read the new keys only",
        says=("new keys only",),
    ),
    # Added with the second round of slips (each named by its first message; see the module's
    # docstring for the ones no test can see).
    # rmsnorm
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms).to(residual.dtype)",
        "x *= inv_rms\n        return self.w * x.to(residual.dtype)",
        "the input scaled in place: residual.float() is the input itself when it is float32",
        name="in-place",
        says=("in place", "float()"),
    ),
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms).to(residual.dtype)",
        "return self.w * (x * inv_rms).half()",
        "the normalised vector cast to float16 whatever the input's dtype",
        name="cast-to-float16",
        says=("float16's rounding", "input's own dtype"),
    ),
    Mutant(
        "rmsnorm",
        "inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)",
        "inv_rms = 1 / (x.norm(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)",
        "divided by the L2 norm (the root of the sum of squares)",
        name="l2-norm",
        says=("l2 norm", "mean square"),
    ),
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms).to(residual.dtype)",
        "return self.w * (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)) + "
        "self.cfg.rms_norm_eps).to(residual.dtype)",
        "epsilon added to the normalised vector instead of the mean square",
        name="eps-added-after",
        says=("added to the normalised vector",),
    ),
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True)",
        "x.abs().mean(dim=-1, keepdim=True).pow(2)",
        "divided by the mean absolute value, not the root mean square",
        name="mean-abs",
        says=("absolute values",),
    ),
    # rope
    Mutant(
        "rope",
        "angles = positions.float()[..., None] * inv_freq",
        "angles = positions.float()[:, :, None] * inv_freq",
        "positions assumed [batch, posn]: 1-D positions (the chapter's plot) fail",
        name="assumes-2d-positions",
        says=("[posn]", "any number of axes"),
    ),
    Mutant(
        "rope",
        "angles = positions.float()[..., None] * inv_freq",
        "angles = torch.outer(positions.float(), inv_freq)",
        "torch.outer, which takes 1-D positions only",
        name="outer",
        says=("torch.outer", "any number of axes"),
    ),
    Mutant(
        "rope",
        "cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)",
        "cos, sin = cos[:, None].half(), sin[:, None].half()",
        "cos and sin cast to float16 whatever x's dtype",
        name="cos-sin-float16",
        says=("rounded to torch.float16", "x's own dtype"),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = torch.arange(0, d_head - 2, 2, device=positions.device).float() / d_head",
        "one frequency too few (d_head/2 - 1 pairs)",
        name="one-frequency-too-few",
        says=("30 angles", "one frequency each"),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = torch.arange(2, d_head + 2, 2, device=positions.device).float() / d_head",
        "pairs counted from 1: exponents 2, 4, ..., d_head",
        name="pairs-from-1",
        says=("your e are [2.0, 4.0",),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = torch.arange(0, d_head, 2, device=positions.device, dtype=torch.float64) "
        "/ d_head",
        "the angles in float64: cos and sin come out float64",
        name="float64",
        says=("float64", "float32"),
    ),
    Mutant(
        "rope",
        "return angles.cos(), angles.sin()",
        "return angles.cos(), torch.cat(\n"
        "        [angles[..., : d_head // 2].sin(), -angles[..., d_head // 2 :].sin()], dim=-1\n"
        "    )",
        "the second half's sines negated (the rotation's minus sign put in the sines)",
        name="second-half-sines-negated",
        says=("indices 16..31 along 'd_head'", "signs are flipped", "rotate_half's"),
    ),
    # swiglu
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu(x @ self.W_gate.T) * (x @ self.W_up.T)) @ self.W_down.T",
        "the weights read transposed",
        name="transposed",
        says=("[in, out]",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu((x @ self.W_gate).float()) * (x @ self.W_up)) @ self.W_down",
        "SiLU taken in float32 and not cast back: a bfloat16 model fails",
        name="silu-in-float32",
        says=("bfloat16", "input's dtype"),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu(x @ self.W_up) * (x @ self.W_gate)) @ self.W_down",
        "W_gate and W_up swapped",
        name="gate-up-swapped",
        says=("up branch",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down + x",
        "the MLP's input added to its output (a residual inside the MLP)",
        name="residual-inside",
        says=("input added",),
    ),
    # expand_kv
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "b, n, p, d = kv.shape\n"
        "    return kv[:, None].expand(b, group_size, n, p, d).reshape(b, group_size * n, p, d)",
        "copies made on a new axis in front of the heads: tiled",
        name="new-axis-in-front",
        says=("consecutive",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.repeat_interleave(group_size // kv.shape[1], dim=1)",
        "group_size read as the number of query heads",
        name="group-size-as-heads",
        says=("copied group_size times",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.repeat_interleave(group_size, dim=0)",
        "repeated along the batch axis",
        name="batch-axis",
        says=("batch axis changed size", "heads axis"),
    ),
    # gqa
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=~allowed)",
        "the mask's meaning inverted",
        name="mask-inverted",
        says=("inverted",),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed.float())",
        "the boolean mask made float: 1 and 0 are added to the scores",
        name="mask-as-float",
        says=("float tensor", "boolean"),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(\n"
        "            q, keys, values, attn_mask=allowed, is_causal=True\n"
        "        )",
        "is_causal=True as well as `allowed`: the cached keys hidden",
        name="mask-and-is-causal",
        says=("is_causal=true", "on top of it"),
    ),
    Mutant(
        "gqa",
        'return einops.einsum(z, self.W_O, "b h p e, h e d -> b p d")',
        'return einops.einsum(z, self.W_O, "b h p e, h e d -> b h p d").mean(1)',
        "the heads' outputs averaged, not summed",
        name="heads-averaged",
        says=("averaged", "summed over the heads"),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "scores = q @ keys.transpose(-1, -2) / q.shape[-1] ** 0.5\n"
        "        if allowed is not None:\n"
        '            scores = scores.masked_fill(~allowed, float("-inf"))\n'
        "        z = scores.softmax(dim=-2) @ values",
        "the softmax taken over the queries axis",
        name="softmax-over-queries",
        says=("queries axis", "last axis"),
    ),
    Mutant(
        "gqa",
        "return (x.flatten(0, 1) @ W).unflatten(1, x.shape[:2]).transpose(0, 1)",
        "return (x.flatten(0, 1) @ W).unflatten(1, x.shape[:2]).permute(1, 2, 0, 3)",
        "projections left [batch, posn, heads, d_head], not heads first",
        name="heads-not-first",
        says=("heads first", "in front of the positions"),
    ),
    Mutant(
        "gqa",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_head // 2, self.cfg.rope_theta)",
        "rope_cos_sin handed the number of pairs, not d_head",
        name="pairs-as-d-head",
        says=("d_head = 4", "head size"),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(\n"
        "            q.float(), keys.float(), values.float(), attn_mask=allowed\n"
        "        )",
        "the attention in float32 and not cast back: a bfloat16 model fails",
        name="attention-in-float32",
        says=("bfloat16", "attend"),
    ),
    Mutant(
        "gqa",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)",
        'if not hasattr(self, "cos_sin"):\n'
        "            self.cos_sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)\n"
        "        cos, sin = self.cos_sin",
        "cos and sin kept on the module from the first call",
        name="angles-kept-from-first-call",
        says=("second call", "earlier call"),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "if allowed is None:\n"
        "            allowed = torch.ones(q.shape[2], keys.shape[2], dtype=torch.bool)\n"
        "        z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "a mask of its own made on the CPU when none is given",
        name="cpu-mask-in-attend",
        says=("attend", "without a device"),
    ),
    # llama
    Mutant(
        "llama",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)",
        "resid_mid = self.attn(self.ln1(resid_pre), positions)",
        "the attention's output replaces the residual stream",
        name="no-attention-residual",
        says=("attention's output replaces",),
    ),
    Mutant(
        "llama",
        "residual = block(residual, positions)",
        "residual = self.ln_final(block(residual, positions))",
        "the final norm applied after every block",
        name="final-norm-after-every-block",
        says=("hands block 1", "other than what block 0 returned"),
    ),
    Mutant(
        "llama",
        "return self.unembed(self.ln_final(residual))",
        "return self.unembed(self.ln_final(residual)).float()",
        "the logits cast to float32 in a bfloat16 model",
        name="logits-cast-to-float32",
        says=("float32 logits", "after the unembedding"),
    ),
    Mutant(
        "llama",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)",
        "positions = torch.arange(resid_pre.shape[1]).expand(resid_pre.shape[:2])\n"
        "        resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)",
        "the block makes positions of its own, on the CPU",
        name="block-own-cpu-positions",
        says=("llamablock.forward", "without a device"),
    ),
    Mutant(
        "llama",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)\n"
        "        return resid_mid + self.mlp(self.ln2(resid_mid))",
        "return resid_pre + self.attn(self.ln1(resid_pre), positions) + "
        "self.mlp(self.ln2(resid_pre))",
        "attention and MLP in parallel on the same input (GPT-J's block)",
        name="parallel-block",
        says=("before the attention",),
    ),
    # llama_cache
    Mutant(
        "llama_cache",
        "positions = positions.expand(tokens.shape)",
        "positions = torch.arange(\n"
        "        cache.length, cache.length + n_new, device=tokens.device\n"
        "    ).expand(tokens.shape)",
        "positions counted over a row's padding (from the cache's length)",
        name="positions-count-padding",
        says=("count the padding",),
    ),
    Mutant(
        "llama_cache",
        "logits = model.unembed(model.ln_final(residual))",
        "logits = model.unembed(model.ln_final(residual[:, -1:]))",
        "the logits of the last new token only",
        name="last-token-logits-only",
        says=("last new token's only",),
    ),
    Mutant(
        "llama_cache",
        "residual = residual + block.attn.attend(q, k, v, allowed)",
        "residual = residual + block.attn.attend(q, k, v, None if n_new == 1 else allowed)",
        "no mask for single steps, padding or not",
        name="single-steps-read-padding",
        says=("padding keys", "every step"),
    ),
    Mutant(
        "llama_cache",
        "residual = residual + block.mlp(block.ln2(residual))",
        "residual = residual + block.mlp(block.ln1(residual))",
        "ln1 before the MLP",
        name="ln1-before-mlp",
        says=("ln1 of resid_mid",),
    ),
    Mutant(
        "llama_cache",
        "positions = positions.expand(tokens.shape)",
        "positions = positions.expand(tokens.shape)[:1]",
        "the first row's positions for every row",
        name="first-rows-positions",
        says=("another row's",),
    ),
    Mutant(
        "llama_cache",
        "q, k, v = block.attn.rotated_qkv(x, positions)",
        "q, k, v = block.attn.rotated_qkv(x, positions)\n        k, v = k.float(), v.float()",
        "keys and values cached in float32 in a bfloat16 model",
        name="cache-in-float32",
        says=("bfloat16", "model's dtype"),
    ),
    Mutant(
        "llama_cache",
        "residual = residual + block.attn.attend(q, k, v, allowed)",
        "if allowed is None:\n"
        "            allowed = torch.ones(n_new, k.shape[2], dtype=torch.bool)\n"
        "        residual = residual + block.attn.attend(q, k, v, allowed)",
        "a mask of its own made on the CPU when none is given",
        name="cpu-mask",
        says=("without a device",),
    ),
    # slips a held-out run found unnamed
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True)",
        "x.mean(dim=-1, keepdim=True).pow(2)",
        "the square of the mean where the mean of the squares belongs",
        name="square-of-the-mean",
        says=("root mean square", "square of the mean"),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "g = x @ self.W_gate\n"
        "        return (g / (1 + torch.exp(g)) * (x @ self.W_up)) @ self.W_down",
        "a hand-written SiLU with exp(+g) where exp(-g) belongs",
        name="silu-exp-plus",
        says=("gate's activation is not silu",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu(x) @ self.W_gate * (x @ self.W_up)) @ self.W_down",
        "SiLU applied to the input, before the gate's projection",
        name="silu-before-projection",
        says=("before", "projection"),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.expand(kv.shape[0], kv.shape[1] * group_size, *kv.shape[2:])",
        "expand used to copy the heads: works only with one key/value head",
        name="expand",
        says=("expand", "size 1"),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "scores = q @ keys.transpose(-1, -2) / q.shape[-1] ** 0.5\n"
        '        scores = scores.masked_fill(~allowed, float("-inf"))\n'
        "        z = scores.softmax(dim=-1) @ values",
        "the mask inverted with ~ whatever it is: allowed=None (no mask) crashes",
        name="none-mask-crashes",
        says=("allowed=none",),
    ),
    Mutant(
        "gqa",
        "return (x.flatten(0, 1) @ W).unflatten(1, x.shape[:2]).transpose(0, 1)",
        "return (x.flatten(0, 1) @ W).reshape(x.shape[0], W.shape[0], x.shape[1], -1)",
        "the projections reshaped to [batch, heads, posn, d_head] where the axes must be moved",
        name="projection-reshaped",
        says=("reshape", "order"),
    ),
    Mutant(
        "llama",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)",
        "resid_pre += self.attn(self.ln1(resid_pre), positions)\n        resid_mid = resid_pre",
        "the block adds the attention's output to its input in place",
        name="block-in-place",
        says=("in place",),
    ),
    Mutant(
        "llama",
        "return self.unembed(self.ln_final(residual))",
        "return self.unembed(self.ln_final(residual)).softmax(-1)",
        "probabilities returned where logits belong",
        name="returns-probabilities",
        says=("probabilities", "logits"),
    ),
    Mutant(
        "llama",
        "return resid_mid + self.mlp(self.ln2(resid_mid))",
        "return resid_pre + self.mlp(self.ln2(resid_mid))",
        "the attention's contribution dropped from what the block returns",
        name="attention-dropped-from-output",
        says=("attention's output is not in what",),
    ),
    Mutant(
        "llama_cache",
        "q, k, v = block.attn.rotated_qkv(x, positions)",
        "q, k, v = block.attn.rotated_qkv(x, positions)\n"
        "        k = expand_kv(k, model.cfg.group_size)\n"
        "        v = expand_kv(v, model.cfg.group_size)",
        "keys and values expanded before attend (which expands them again) and cached expanded",
        name="expanded-before-attend",
        says=("n_kv_heads", "attend"),
    ),
    Mutant(
        "llama_cache",
        "residual = residual + block.attn.attend(q, k, v, allowed)",
        "residual = residual + block.attn.attend(\n"
        "            q, k, v, allowed if past_k.shape[2] == 0 else None\n"
        "        )",
        "no mask once the cache holds anything",
        name="no-mask-after-prefill",
        says=("mask",),
    ),
    # held out from the chapter's tests, named after one run (a learner's slips of our own)
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms).to(residual.dtype)",
        "return self.w * (residual * inv_rms.to(residual.dtype))",
        "the scale cast to 16 bits and multiplied with the 16-bit input, instead of "
        "normalising in float32 and casting the result",
        name="scale-cast-before-product",
        says=("normalisation in float32",),
    ),
    Mutant(
        "rope",
        "angles = positions.float()[..., None] * inv_freq",
        "angles = positions.float()[:, None] * inv_freq",
        "the frequencies' new axis put after the first axis ([:, None]), right for 1-D "
        "positions only",
        name="new-axis-after-the-first",
        says=("number of axes",),
    ),
    Mutant(
        "rope",
        "sin[:, None].to(x.dtype)",
        "sin[:, None]",
        "apply_rope casts cos to the input's dtype but not sin",
        name="sin-not-cast",
        says=("promote",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.repeat_interleave(group_size, dim=-1)",
        "the copies made along the last axis (d_head) instead of the heads axis",
        name="copies-along-d_head",
        says=("heads axis",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.repeat_interleave(group_size - 1, dim=1)",
        "group_size - 1 copies of each key/value head",
        name="one-copy-too-few",
        says=("group_size times",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.expand(-1, kv.shape[1] * group_size, -1, -1)",
        "Tensor.expand to n_kv_heads * group_size heads, which repeats axes of size 1 only",
        name="tensor-expand",
        says=("axes of size 1",),
    ),
    Mutant(
        "gqa",
        "attn_mask=allowed)",
        "attn_mask=allowed if allowed is None else allowed.to(q.dtype))",
        "the boolean mask cast to the queries' dtype, which SDPA adds to the scores",
        name="mask-made-float",
        says=("float mask", "boolean"),
    ),
    Mutant(
        "gqa",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_head",
        "cos, sin = rope_cos_sin(torch.arange(x.shape[1]).expand(x.shape[:2]), self.cfg.d_head",
        "rotated_qkv turns by 0, 1, ... made afresh instead of the positions given",
        name="positions-made-afresh",
        says=("positions given",),
    ),
    Mutant(
        "llama",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)",
        "x = self.ln1(resid_pre)\n        resid_mid = x + self.attn(x, positions)",
        "the attention's output added to ln1(resid_pre) instead of the residual stream",
        name="attention-added-to-its-norm",
        says=("normalised input",),
    ),
    Mutant(
        "llama_cache",
        "        k = torch.cat([past_k, k], dim=2)\n"
        "        v = torch.cat([past_v, v], dim=2)\n"
        "        residual = residual + block.attn.attend(q, k, v, allowed)",
        "        all_k = torch.cat([past_k, k], dim=2)\n"
        "        all_v = torch.cat([past_v, v], dim=2)\n"
        "        residual = residual + block.attn.attend(q, all_k, all_v, allowed)",
        "the whole keys read by the attention, but only the new keys and values cached",
        name="only-new-keys-cached",
        says=("already cached",),
    ),
    Mutant(
        "llama_cache",
        "positions = positions.expand(tokens.shape)",
        "positions = positions.expand(tokens.shape) + cache.length",
        "the cache's length added to positions that already count the cached tokens",
        name="cache-length-added-again",
        says=("counted twice",),
    ),
    # held out from the chapter's tests (a fourth set, none a mutant before), named after one run
    Mutant(
        "rmsnorm",
        "inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)",
        "inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.cfg.rms_norm_eps)",
        "the root taken twice: the RMS computed with .sqrt() and then rsqrt of it, so the "
        "vector is divided by the fourth root of the mean square",
        name="ho-the-root-taken-twice-the",
        says=("fourth root",),
    ),
    Mutant(
        "rmsnorm",
        "x = residual.float()\n"
        "        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + "
        "self.cfg.rms_norm_eps)\n"
        "        return self.w * (x * inv_rms).to(residual.dtype)",
        "x = self.w * residual.float()\n"
        "        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + "
        "self.cfg.rms_norm_eps)\n"
        "        return (x * inv_rms).to(residual.dtype)",
        "the weight applied to the input before the mean square is taken, not to the "
        "normalised vector: the norm divides the weight's scale back out",
        name="ho-the-weight-applied-to-the",
        says=("weight all ones",),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = torch.linspace(0, 1, d_head // 2, device=positions.device)",
        "exponents spaced evenly from 0 to 1 inclusive (linspace) instead of 0, 2/d, ..., "
        "(d-2)/d: the last pair's frequency is 1/theta and every pair but the first turns "
        "a little too slowly",
        name="ho-exponents-spaced-evenly-from-0",
        says=("0, 2, 4, 6",),
    ),
    Mutant(
        "rope",
        "return x * cos + rotate_half(x) * sin",
        "return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin",
        "the halves swapped with roll instead of rotate_half: (x2, x1) where (-x2, x1) "
        "belongs, the minus sign lost",
        name="ho-the-halves-swapped-with-roll",
        says=("minus",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_gate)) @ self.W_down",
        "copy-paste: the linear branch projected with W_gate again, W_up never used",
        name="ho-copy-paste-the-linear-branch",
        says=("W_up is never used",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu(x @ self.W_gate) @ self.W_down) * ((x @ self.W_up) @ self.W_down)",
        "the down projection applied to each branch separately and the two products "
        "multiplied, instead of projecting the gated product once",
        name="ho-the-down-projection-applied-to",
        says=("doubling W_down",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "b, n, p, d = kv.shape\n"
        "    return kv[:, :, None].expand(b, n, group_size, p, d).flatten(2, 3)",
        "HF's expand-then-flatten with the wrong axes flattened: the copies merged into "
        "the positions axis ([b, n_kv, group*pos, d]) instead of the heads axis",
        name="ho-hf-s-expand-then-flatten",
        says=("positions axis changed size",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.repeat_interleave(group_size)",
        "repeat_interleave without dim=: the tensor is flattened and every number "
        "repeated, a 1-D result",
        name="ho-repeat-interleave-without-dim-the",
        says=("heads axis",),
    ),
    Mutant(
        "gqa",
        "        values = expand_kv(values, self.cfg.group_size)\n",
        "",
        "the keys expanded for their groups but the values forgotten: works only by "
        "broadcasting with one key/value head (or groups of 1)",
        name="ho-the-keys-expanded-for-their",
        says=("expanded keys or values",),
    ),
    Mutant(
        "gqa",
        "q, k, v = project(self.W_Q), project(self.W_K), project(self.W_V)",
        "q, k, v = project(self.W_Q), project(self.W_K), project(self.W_K)",
        "copy-paste: the values projected with W_K, W_V never used",
        name="ho-copy-paste-the-values-projected",
        says=("W_V",),
    ),
    Mutant(
        "llama",
        "return resid_mid + self.mlp(self.ln2(resid_mid))",
        "return resid_mid + self.ln2(self.mlp(resid_mid))",
        "ln2 applied to the MLP's output instead of its input: the MLP reads the "
        "un-normalised stream",
        name="ho-ln2-applied-to-the-mlp",
        says=("output goes through ln2",),
    ),
    Mutant(
        "llama",
        "residual = block(residual, positions)",
        "residual = block(self.embed(tokens), positions)",
        "every block handed the embeddings instead of the previous block's output: only "
        "the last block's work survives (right only for a 1-layer model)",
        name="ho-every-block-handed-the-embeddings",
        says=("other than what block 0 returned",),
    ),
    Mutant(
        "llama_cache",
        "zip(model.blocks, cache.keys, cache.values, strict=True)",
        "zip(model.blocks, cache.keys, cache.keys, strict=True)",
        "copy-paste in the zip: the cached values read from cache.keys, so every step "
        "after the prefill attends to old keys as values",
        name="ho-copy-paste-in-the-zip",
        says=("are that layer's keys",),
    ),
    Mutant(
        "llama_cache",
        "strict=True):\n        x = block.ln1(residual)",
        "strict=True):\n        keys, values = [], []\n        x = block.ln1(residual)",
        "the lists of new keys and values started afresh inside the layer loop: only the "
        "last layer's are kept (right only for a 1-layer model)",
        name="ho-the-lists-of-new-keys",
        says=("one per layer",),
    ),
    # held out from the chapter's tests (a fifth set, none a mutant before), named after one run
    Mutant(
        "rmsnorm",
        "inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)",
        "inv_rms = 1 / (x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)",
        "the square root forgotten: the vector divided by its mean square (power -1) "
        "instead of its root mean square (power -1/2)",
        name="ho5-the-square-root-forgotten-the",
        says=("not its root",),
    ),
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)",
        "x.pow(2).mean(dim=-1, keepdim=True).clamp(min=self.cfg.rms_norm_eps))",
        "epsilon used as a floor on the mean square (clamp, as F.normalize does) instead "
        "of added to it: the same only when epsilon is tiny next to the mean square",
        name="ho5-epsilon-used-as-a-floor",
        says=("epsilon changes nothing",),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head",
        "exponents = (torch.arange(0, d_head, 2, device=positions.device) // d_head).float()",
        "the exponents 2i / d_head computed by integer floor division before the cast to "
        "float: all 0, so every pair turns by one radian per position",
        name="ho5-the-exponents-2i-d-head",
        says=("0, 2, 4, 6",),
    ),
    Mutant(
        "rope",
        "return angles.cos(), angles.sin()",
        "return angles.sin(), angles.cos()",
        "rope_cos_sin returns (sin, cos) where the contract (and apply_rope's caller) "
        "wants (cos, sin)",
        name="ho5-rope-cos-sin-returns-sin",
        says=("swapped",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu(x @ self.W_gate) * F.silu(x @ self.W_up)) @ self.W_down",
        "SiLU applied to both branches: the up branch, which must stay linear, goes "
        "through SiLU too",
        name="ho5-silu-applied-to-both-branches",
        says=("doubling W_up",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return (F.silu(x @ self.W_gate) * x @ self.W_up) @ self.W_down",
        "the parentheses around x @ W_up dropped: the gate [.., d_mlp] multiplies the "
        "input x [.., d_model] before the up projection (shapes clash when d_mlp != "
        "d_model)",
        name="ho5-the-parentheses-around-x-w",
        says=("it was raised in your",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv[:, torch.arange(kv.shape[1] * group_size, device=kv.device) // kv.shape[1]]",
        "heads picked by fancy indexing with query head h reading key/value head h // "
        "n_kv_heads instead of h // group_size: right only when n_kv_heads == group_size",
        name="ho5-heads-picked-by-fancy-indexing",
        says=("it was raised in your",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv[:, torch.arange(kv.shape[1] * group_size, device=kv.device) % group_size]",
        "heads picked by fancy indexing with h % group_size (modulo) where h // group_size "
        "(the group's index) belongs",
        name="ho5-heads-picked-by-modulo",
        says=("it was raised in your",),
    ),
    Mutant(
        "gqa",
        "return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v",
        "return q, apply_rope(k, cos, sin), v",
        "the queries never rotated, only the keys: scores then depend on the key's "
        "absolute position, not the offset",
        name="ho5-the-queries-never-rotated-only",
        says=("queries are not rotated",),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, "
        "scale=self.cfg.d_head**0.5)",
        "the scores multiplied by sqrt(d_head) (scale= given the root itself) instead of "
        "divided by it",
        name="ho5-the-scores-multiplied-by-sqrt",
        says=("multiplied by sqrt(d_head)",),
    ),
    Mutant(
        "llama",
        "residual = block(residual, positions)",
        "residual = block(residual, tokens)",
        "the token ids handed to the blocks as their positions: queries and keys turned by "
        "token id, not by place",
        name="ho5-the-token-ids-handed-to",
        says=("token ids",),
    ),
    Mutant(
        "llama",
        "return resid_mid + self.mlp(self.ln2(resid_mid))",
        "return resid_mid + self.mlp(resid_mid)",
        "ln2 forgotten: the MLP reads the un-normalised residual stream (ln2 is created "
        "but never used)",
        name="ho5-ln2-forgotten-the-mlp-reads",
        says=("ln2(resid_mid)",),
    ),
    Mutant(
        "llama_cache",
        "        residual = residual + block.mlp(block.ln2(residual))\n",
        "",
        "the MLP sub-layer left out of the cached forward: each layer adds only its attention",
        name="ho5-the-mlp-sub-layer-left",
        says=("nothing more",),
    ),
    Mutant(
        "llama_cache",
        "positions = positions.expand(tokens.shape)",
        "positions = positions[None].expand(tokens.shape)",
        "a batch axis added in front of positions before expanding: works for chapter 6's "
        "[new] positions, crashes for chapter 4's [batch, new]",
        name="ho5-a-batch-axis-added-in",
        says=("it was raised in your",),
    ),
    # held out from the chapter's tests (a sixth set, none a mutant before), named after one run
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True)",
        "x.pow(2).sum(dim=-1, keepdim=True) / (x.shape[-1] - 1)",
        "the sum of squares divided by d_model - 1 (Bessel's correction, as for an "
        "unbiased variance) instead of d_model: the mean square a little too large",
        name="ho6-the-sum-of-squares-divided",
        says=("d_model - 1",),
    ),
    Mutant(
        "rmsnorm",
        "x = residual.float()",
        "x = residual.float().flatten(0, -2)",
        "the input flattened to rows [batch*posn, d_model] (as chapter 8's runner feeds "
        "them) and never reshaped back: 3-D input comes out 2-D",
        name="ho6-the-input-flattened-to-rows",
        says=("expected shape",),
    ),
    Mutant(
        "rope",
        "angles = torch.cat([angles, angles], dim=-1)",
        "angles = angles.repeat(1, 2)",
        "the two copies of the angles made with angles.repeat(1, 2), which names two axes: "
        "right for 1-D positions [posn], raises for batched positions [batch, posn]",
        name="ho6-the-two-copies-of-the",
        says=("number of axes",),
    ),
    Mutant(
        "rope",
        "return x * cos + rotate_half(x) * sin",
        "return x * cos + rotate_half(x) * cos",
        "copy-paste in apply_rope: the cosines multiply rotate_half(x) too, the sines never used",
        name="ho6-copy-paste-in-apply-rope",
        says=("sin is never used",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "g = x @ self.W_gate\n"
        "        silu = g / 1 + torch.exp(-g)\n"
        "        return (silu * (x @ self.W_up)) @ self.W_down",
        "a hand-written SiLU with the parentheses lost: g / 1 + exp(-g) where g / (1 + "
        "exp(-g)) belongs",
        name="ho6-a-hand-written-silu-with",
        says=("not silu",),
    ),
    Mutant(
        "swiglu",
        "(x @ self.W_up)) @ self.W_down",
        "(x @ self.W_up)) @ self.W_up.T",
        "the down projection written as W_up transposed (as if tied to the up projection): "
        "W_down never used",
        name="ho6-the-down-projection-written-as",
        says=("W_down is never used",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv[:, :1].expand(-1, kv.shape[1] * group_size, -1, -1)",
        "multi-query attention assumed: key/value head 0 expanded to n_kv_heads * "
        "group_size heads, every query head reads it and the other key/value heads are "
        "dropped (right only with one key/value head)",
        name="ho6-multi-query-attention-assumed-key",
        says=("copies of the key/value heads",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "b, n, p, d = kv.shape\n"
        "    return kv[:, :, None].expand(b, n, group_size, p, d).view(b, n * group_size, "
        "p, d)",
        "HF's expand-then-reshape written with .view: the expanded copies (stride 0) "
        "cannot be merged with the heads axis by a view, so it raises whenever group_size "
        "> 1",
        name="ho6-hf-s-expand-then-reshape",
        says=("it was raised in your",),
    ),
    Mutant(
        "gqa",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)",
        "cos, sin = rope_cos_sin(positions, self.cfg.d_model, self.cfg.rope_theta)",
        "rope_cos_sin handed d_model instead of d_head: one angle column per coordinate of "
        "the residual stream, not of a head",
        name="ho6-rope-cos-sin-handed-d",
        says=("d_head",),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, dropout_p=0.1)",
        "attention dropout (dropout_p=0.1) passed to scaled_dot_product_attention: the "
        "function drops whatever the module's mode, so attention is random at inference",
        name="ho6-attention-dropout-dropout-p-0",
        says=("two different outputs",),
    ),
    Mutant(
        "llama",
        "positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape)",
        "positions = torch.arange(tokens.shape[1], device=tokens.device).repeat(tokens.shape[0])",
        "positions made with .repeat(batch) instead of expanded: a flat [batch*posn] "
        "vector where [batch, posn] belongs",
        name="ho6-positions-made-with-repeat-batch",
        says=("positions your forward hands",),
    ),
    Mutant(
        "llama",
        "residual = self.embed(tokens)",
        "residual = self.ln_final(self.embed(tokens))",
        "ln_final also applied to the embeddings (an embedding norm): the stream is "
        "normalised before the first block as well as before the unembedding",
        name="ho6-ln-final-also-applied-to",
        says=("other than what the embeddings returned",),
    ),
    Mutant(
        "llama_cache",
        "keys, values = [], []",
        "keys = values = []",
        "keys = values = []: one list under two names, so each layer's keys and values "
        "both go into it and the new cache holds 2 * n_layers tensors, keys and values "
        "interleaved, as both its keys and its values",
        name="ho6-keys-values-one-list-under",
        says=("one list under two names",),
    ),
    Mutant(
        "llama_cache",
        "residual = residual + block.attn.attend(q, k, v, allowed)",
        "residual = residual + block.attn.attend(q, k, v, mask)",
        "the padding mask of all positions (start_forward's [batch, all]) passed to attend "
        "where the causal `allowed` belongs: at batch 1 it hides nothing (a prefill reads "
        "later tokens), at batch > 1 it does not broadcast",
        name="ho6-the-padding-mask-of-all",
        says=("given `allowed`",),
    ),
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)",
        "x.pow(2).mean(dim=-1, keepdim=True))",
        "epsilon forgotten altogether: rsqrt of the bare mean square, right only while the "
        "mean square is large next to rms_norm_eps (infinite for an all-zero vector)",
        name="ho7-epsilon-forgotten-altogether-rsqrt-of",
        says=("your epsilon changes nothing",),
    ),
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms).to(residual.dtype)",
        "return self.w * (x * inv_rms).to(self.w.dtype)",
        "the normalised vector cast back to the weight's dtype (self.w.dtype) instead of the "
        "input's: a 16-bit input with a float32 weight comes out float32, a float32 input with "
        "a 16-bit weight is rounded to 16 bits",
        name="ho7-the-normalised-vector-cast-back",
        says=("cast to the weight's dtype",),
    ),
    Mutant(
        "rope",
        "    angles = torch.cat([angles, angles], dim=-1)\n",
        "",
        "the half-split copy of the angles forgotten: cos and sin come out [*batch, posn, "
        "d_head/2], one column per pair instead of each angle in column i and i + d_head/2",
        name="ho7-the-half-split-copy-of",
        says=("writes those angles twice",),
    ),
    Mutant(
        "rope",
        "cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)",
        "cos, sin = cos[None].to(x.dtype), sin[None].to(x.dtype)",
        "the heads axis of cos and sin added in front ([1, batch, posn, d_head]) instead of "
        "after the batch: right at batch 1, fails (or pairs batch rows with heads) for a batch",
        name="ho7-the-heads-axis-of-cos",
        says=("an axis of size 1 for the heads",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return ((x @ self.W_gate).softmax(dim=-1) * (x @ self.W_up)) @ self.W_down",
        "the gate made a softmax over the hidden units (a mixture-of-experts router's habit) "
        "instead of SiLU of each unit: gate values that sum to 1 across d_mlp",
        name="ho7-the-gate-made-a-softmax",
        says=("not SiLU",),
    ),
    Mutant(
        "swiglu",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down",
        "return F.silu(x @ self.W_gate) @ self.W_down",
        "the up branch forgotten (chapter 1's one-projection MLP): SiLU(x W_gate) W_down, W_up "
        "never used, nothing gated",
        name="ho7-the-up-branch-forgotten-chapter",
        says=("W_up is never used",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return kv.repeat_interleave(kv.shape[1], dim=1)",
        "each head repeated n_kv_heads times (the size of the heads axis, kv.shape[1]) instead "
        "of group_size times: right only when n_kv_heads == group_size",
        name="ho7-each-head-repeated-n-kv",
        says=("copied group_size times",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "kv = kv.repeat_interleave(group_size, dim=1)",
        "the expanded tensor assigned to the local kv and never returned: expand_kv returns None",
        name="ho7-the-expanded-tensor-assigned-to",
        says=("without returning its result",),
    ),
    Mutant(
        "gqa",
        "keys = expand_kv(keys, self.cfg.group_size)\n"
        "        values = expand_kv(values, self.cfg.group_size)",
        "keys = expand_kv(keys, self.cfg.n_heads)\n"
        "        values = expand_kv(values, self.cfg.n_heads)",
        "expand_kv handed n_heads (the number of heads wanted) instead of group_size (copies "
        "per key/value head): right only for multi-query attention, n_kv_heads == 1",
        name="ho7-expand-kv-handed-n-heads",
        says=("self.cfg.group_size",),
    ),
    Mutant(
        "gqa",
        '"b h p e, h e d -> b p d"',
        '"b h p e, h d e -> b p d"',
        "W_O's axes named in the wrong order in the output einsum (h d e for [n_heads, d_head, "
        "d_model]): W_O read transposed, right only if d_head == d_model",
        name="ho7-w-o-s-axes-named",
        says=("it was raised in your",),
    ),
    Mutant(
        "llama",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)",
        "resid_mid = resid_pre + self.attn(resid_pre, positions)",
        "ln1 forgotten: the attention reads the raw residual stream (ln1 is created but never "
        "used)",
        name="ho7-ln1-forgotten-the-attention-reads",
        says=("the attention reads the residual stream itself",),
    ),
    Mutant(
        "llama",
        "residual = self.embed(tokens)",
        "residual = self.embed(tokens) + self.embed(positions)",
        "chapter 1's habit of adding a position embedding, made from the token embedding of "
        "the position numbers: the stream starts as embed(tokens) + embed(positions)",
        name="ho7-chapter-1-s-habit-of",
        says=("a position embedding",),
    ),
    Mutant(
        "llama_cache",
        "x = block.ln1(residual)",
        "x = block.ln2(residual)",
        "copy-paste: the attention of the cached forward reads the stream through the MLP's "
        "norm ln2 instead of ln1",
        name="ho7-copy-paste-the-attention-of",
        says=("ln2 of the residual stream",),
    ),
    Mutant(
        "llama_cache",
        "residual = residual + block.attn.attend(q, k, v, allowed)",
        "residual = block.attn.attend(q, k, v, allowed)",
        "the attention's residual connection forgotten in the cached forward: the attention "
        "output replaces the stream instead of being added to it",
        name="ho7-the-attention-s-residual-connection",
        says=("replaces the residual stream",),
    ),
    Mutant(
        "rmsnorm",
        "x.pow(2).mean(dim=-1, keepdim=True)",
        "x.pow(2).sum(dim=-1, keepdim=True) / len(x)",
        "the mean square written as a sum divided by len(x), which is the length of the first "
        "axis (the batch, or the tokens of 2-D input), not d_model",
        name="ho8-the-mean-square-written-as",
        says=("length of the FIRST axis",),
    ),
    Mutant(
        "rmsnorm",
        "return self.w * (x * inv_rms)",
        "return self.w[None, None] * (x * inv_rms)",
        "the weight given two leading axes to line up with [batch, posn, d_model]: right for "
        "3-D input, but 2-D input [tokens, d_model] (chapter 8's runner) comes out 3-D [1, "
        "tokens, d_model]",
        name="ho8-the-weight-given-two-leading",
        says=("a weight given leading axes",),
    ),
    Mutant(
        "rope",
        "exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head\n"
        "    inv_freq = 1.0 / theta**exponents",
        "inv_freq = 1.0 / theta ** torch.arange(0, d_head, 2, device=positions.device).float() "
        "/ d_head",
        "the frequencies written on one line without parentheses: ** binds before /, so the "
        "division by d_head applies to the frequency (theta^(-2i) / d_head) instead of the "
        "exponent (theta^(-2i/d_head))",
        name="ho8-the-frequencies-written-on-one",
        says=("** binds before /",),
    ),
    Mutant(
        "rope",
        "    return x * cos + rotate_half(x) * sin",
        "    x = x * cos\n    return x + rotate_half(x) * sin",
        "apply_rope split into two lines that reuse the name x: rotate_half then reads the "
        "already scaled x * cos, giving x cos + rotate_half(x) cos sin instead of x cos + "
        "rotate_half(x) sin",
        name="ho8-apply-rope-split-into-two",
        says=("rotate_half reads x already multiplied",),
    ),
    Mutant(
        "swiglu",
        "x = normalized_resid_mid\n",
        "x = normalized_resid_mid.reshape(-1, self.cfg.d_model)\n",
        "the input flattened to rows [batch*posn, d_model] for plain 2-D matrix products and "
        "never reshaped back: the MLP returns [batch*posn, d_model] instead of [batch, posn, "
        "d_model]",
        name="ho8-the-input-flattened-to-rows",
        says=("the right values, in the wrong shape",),
    ),
    Mutant(
        "swiglu",
        "F.silu(x @ self.W_gate)",
        "F.hardswish(x @ self.W_gate)",
        "SiLU's other name, Swish, looked up in torch and F.hardswish taken: a piecewise "
        "approximation (0 below -3, z above 3, z(z+3)/6 between) gates where SiLU's "
        "z*sigmoid(z) belongs",
        name="ho8-silu-s-other-name-swish",
        says=("not SiLU",),
    ),
    Mutant(
        "expand_kv",
        "    return kv.repeat_interleave(group_size, dim=1)",
        "    if kv.shape[1] == 1:\n"
        "        return kv  # one key/value head: broadcasting shares it\n"
        "    return kv.repeat_interleave(group_size, dim=1)",
        "a single key/value head returned as it is, counting on broadcasting: multi-query "
        "input [batch, 1, pos, d_head] is not expanded to group_size heads",
        name="ho8-a-single-key-value-head",
        says=("copied group_size times",),
    ),
    Mutant(
        "expand_kv",
        "return kv.repeat_interleave(group_size, dim=1)",
        "return torch.cat(\n"
        "        [kv[:, h : h + 1].expand(-1, group_size, -1, -1) for h in range(kv.shape[1] - "
        "1)], dim=1\n"
        "    )",
        "each key/value head's group built in a loop over range(n_kv_heads - 1), one head "
        "short: the last group is missing, (n_kv_heads - 1) * group_size heads come out, and "
        "nothing at all (torch.cat of an empty list) for one key/value head",
        name="ho8-each-key-value-head-s",
        says=("stop one short",),
    ),
    Mutant(
        "gqa",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, "
        "is_causal=allowed is None)",
        "allowed=None taken to mean 'the default, causal' (is_causal=True) instead of 'every "
        "key may be read': a lone new query after a cache (the cached forward's decode step) "
        "reads only the first key",
        name="ho8-allowed-none-taken-to-mean",
        says=("is_causal=True",),
    ),
    Mutant(
        "gqa",
        "q, k, v = project(self.W_Q), project(self.W_K), project(self.W_V)",
        "q, k, v = project(self.W_Q), project(self.W_Q), project(self.W_V)",
        "copy-paste: the keys projected with W_Q, W_K never used (the keys get n_heads heads, "
        "the same numbers as the queries)",
        name="ho8-copy-paste-the-keys-projected",
        says=("projected with W_Q",),
    ),
    Mutant(
        "llama",
        "return self.unembed(self.ln_final(residual))",
        "return self.unembed(self.ln_final(residual[:, -1:]))",
        "the generate loop's habit: logits only for the last position ([batch, 1, d_vocab]) "
        "instead of every position",
        name="ho8-the-generate-loop-s-habit",
        says=("logits at EVERY position",),
    ),
    Mutant(
        "llama",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)\n"
        "        return resid_mid + self.mlp(self.ln2(resid_mid))",
        "attn_out = self.attn(self.ln1(resid_pre), positions)\n"
        "        resid_mid = resid_pre + attn_out\n"
        "        return resid_mid + self.mlp(self.ln2(attn_out))",
        "the attention's output named, and the MLP fed ln2 of that output alone instead of the "
        "residual stream it was added to",
        name="ho8-the-attention-s-output-named",
        says=("ln2 of the attention's output alone",),
    ),
    Mutant(
        "llama_cache",
        "v = torch.cat([past_v, v], dim=2)",
        "v = torch.cat([past_v, k], dim=2)",
        "copy-paste: the values joined with k (already the cached plus new keys) instead of v: "
        "the prefill's values are its keys, and after it the values are longer than the keys",
        name="ho8-copy-paste-the-values-joined",
        says=("are that layer's KEYS",),
    ),
    Mutant(
        "llama_cache",
        "logits = model.unembed(model.ln_final(residual))",
        "logits = model.unembed(block.ln2(residual))",
        "the last block's ln2 (the loop variable, still bound after the loop) used as the "
        "final norm instead of model.ln_final",
        name="ho8-the-last-block-s-ln2",
        says=("the last block's ln2",),
    ),
    # A learner's run of the whole chapter from the blank notebook (70 slips, 68 named first
    # before these).
    Mutant(
        "llama_cache",
        "        keys.append(k)\n        values.append(v)",
        "        keys.append(expand_kv(k, model.cfg.group_size))\n"
        "        values.append(expand_kv(v, model.cfg.group_size))",
        "the keys and values cached after expand_kv, n_heads of them (a learner's run, chapter 7)",
        says=("cached after expand_kv",),
    ),
    Mutant(
        "rmsnorm",
        "torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)",
        "torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)) + self.cfg.rms_norm_eps",
        "epsilon added after the rsqrt (a learner's run, chapter 7)",
        says=("inside the rsqrt",),
    ),
    Mutant(
        "rmsnorm",
        "        x = residual.float()",
        "        x = residual",
        "the mean square in the input's 16-bit dtype (a learner's run, chapter 7)",
        says=("float32",),
    ),
    # More of the same learner's run: each slip a mutant
    Mutant(
        "llama_cache",
        "k = torch.cat([past_k, k], dim=2)\n        v = torch.cat([past_v, v], dim=2)",
        "k = torch.cat([k, past_k], dim=2)\n        v = torch.cat([v, past_v], dim=2)",
        "the new keys and values both joined before the cached ones (a learner's run, chapter 7)",
        name="lr7-new-keys-and-values-before-cached",
        says=("before the cached ones",),
    ),
    Mutant(
        "llama_cache",
        "residual = model.embed(tokens)",
        "residual = model.embed(tokens).float()",
        "the cached forward's residual stream made float32 whatever the model's dtype "
        "(a learner's run, chapter 7)",
        name="lr7-cached-residual-stream-made-float32",
        says=("left bfloat16", "residual stream"),
    ),
    Mutant(
        "llama_cache",
        "residual = residual + block.attn.attend(q, k, v, allowed)\n"
        "        residual = residual + block.mlp(block.ln2(residual))",
        "residual = block(residual, positions)",
        "the block's own forward called in the cached forward: the cache is built but the "
        "attention reads the new keys only (a learner's run, chapter 7)",
        name="lr7-block-own-forward-in-cached-forward",
        says=("new keys only",),
    ),
    Mutant(
        "swiglu",
        "x = normalized_resid_mid\n",
        "x = normalized_resid_mid.float()\n",
        "the input cast to float32, then multiplied by 16-bit weights (a learner's run, chapter 7)",
        name="lr7-input-cast-to-float32",
        says=("leaves bfloat16",),
    ),
]
