"""Chapter 1's learner-style mutants (see tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

MUTANTS = [
    Mutant(
        "token_strings",
        "[tokenizer.decode([i]) for i in ids]",
        "tokenizer.convert_ids_to_tokens(ids)",
        "the tokenizer's internal token names (Ġ for a space) instead of decoded strings",
        says=("decode",),
    ),
    # LayerNorm
    Mutant(
        "layernorm",
        "+ self.cfg.layer_norm_eps).sqrt()",
        "+ 1e-5).sqrt()",
        "epsilon hard-coded as GPT-2's 1e-5 instead of read from the config",
        says=("layer_norm_eps",),
    ),
    Mutant(
        "layernorm",
        "(residual.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()",
        "residual.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.cfg.layer_norm_eps",
        "epsilon added outside the square root",
        says=("epsilon", "sqrt"),
    ),
    Mutant(
        "layernorm",
        "residual.pow(2).mean(dim=-1, keepdim=True)",
        "residual.var(dim=-1, keepdim=True)",
        "the unbiased variance (divides by d_model - 1)",
        says=("variance",),
    ),
    Mutant(
        "layernorm",
        "return residual / scale * self.w + self.b",
        "return residual / scale * self.w",
        "the bias b forgotten",
        says=("+ b",),
    ),
    Mutant(
        "layernorm",
        "residual = residual - residual.mean(dim=-1, keepdim=True)",
        "residual -= residual.mean(dim=-1, keepdim=True)",
        "centring in place, which changes the caller's residual stream",
        says=("in place",),
    ),
    Mutant(
        "layernorm",
        "residual - residual.mean(dim=-1, keepdim=True)",
        "residual - residual.mean(dim=1, keepdim=True)",
        "the mean over positions instead of over d_model",
        says=("d_model",),
    ),
    # Embeddings
    Mutant(
        "embed",
        "return self.W_E[tokens]",
        "return self.W_E[tokens] * self.cfg.d_model**0.5",
        "embeddings scaled by sqrt(d_model), as in the original Transformer but not GPT-2",
        says=("sqrt(d_model)",),
    ),
    Mutant(
        "embed",
        "self.W_pos[:seq_len], ",
        "self.W_pos[tokens[0]], ",
        "positions looked up by token id instead of by position",
        says=("token id",),
    ),
    Mutant(
        "embed",
        "self.W_pos[:seq_len], ",
        "self.W_pos[-seq_len:], ",
        "the last seq_len positions instead of the first",
        says=("last",),
    ),
    # Attention
    Mutant(
        "attention",
        ", dtype=torch.bool, device=attn_scores.device), diagonal=1",
        ", dtype=torch.bool), diagonal=1",
        "the causal mask made on the CPU (no device=): on a GPU it meets scores on the GPU",
        says=("device=",),
    ),
    Mutant(
        "attention",
        "/ self.cfg.d_head**0.5",
        "/ self.cfg.d_head",
        "scores divided by d_head instead of sqrt(d_head)",
        says=("sqrt(d_head)",),
    ),
    Mutant(
        "attention",
        "/ self.cfg.d_head**0.5",
        "/ self.cfg.d_model**0.5",
        "scores scaled by sqrt(d_model) instead of sqrt(d_head)",
        says=("sqrt(d_head)",),
    ),
    Mutant(
        "attention",
        "diagonal=1\n",
        "diagonal=0\n",
        "the mask also hides each query's own position",
        says=("diagonal",),
    ),
    Mutant(
        "attention",
        "pattern = self.apply_causal_mask(scores).softmax(dim=-1)",
        "pattern = self.apply_causal_mask(scores).softmax(dim=-2)",
        "softmax over the queries instead of the keys",
        says=("softmax",),
    ),
    Mutant(
        "attention",
        '"b q h e, h e d -> b q d") + self.b_O',
        '"b q h e, h e d -> b q d")',
        "the output bias b_O forgotten",
        says=("b_O",),
    ),
    Mutant(
        "attention",
        '"b p d, h d e -> b p h e") + self.b_V',
        '"b p d, h d e -> b p h e")',
        "the value bias b_V forgotten",
        says=("b_V",),
    ),
    Mutant(
        "attention",
        "return attn_scores.masked_fill(future, self.IGNORE)",
        "return attn_scores.masked_fill_(future, self.IGNORE)",
        "apply_causal_mask writes into the scores it was given",
        says=("in place",),
    ),
    # MLP
    Mutant(
        "mlp",
        "post = gelu_new(pre)",
        "post = torch.nn.functional.gelu(pre)",
        "the exact (erf) GELU instead of GPT-2's tanh approximation",
        says=("gelu",),
    ),
    Mutant(
        "mlp",
        "pre = normalized_resid_mid @ self.W_in + self.b_in",
        "pre = normalized_resid_mid @ self.W_in",
        "the bias b_in forgotten",
        says=("b_in",),
    ),
    Mutant(
        "mlp",
        "post = gelu_new(pre)",
        "post = torch.relu(pre)",
        "ReLU instead of GELU",
        says=("gelu",),
    ),
    # Block
    Mutant(
        "block",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre))",
        "resid_mid = self.ln1(resid_pre + self.attn(resid_pre))",
        "post-LN: normalising the residual stream after adding (the original Transformer)",
        says=("pre-ln",),
    ),
    Mutant(
        "block",
        "resid_post = resid_mid + self.mlp(self.ln2(resid_mid))",
        "resid_post = resid_mid + self.mlp(self.ln2(resid_pre))",
        "the MLP reads the stream from before attention was added",
        says=("resid_mid",),
    ),
    Mutant(
        "block",
        "self.mlp(self.ln2(resid_mid))",
        "self.mlp(self.ln1(resid_mid))",
        "ln1 used twice, ln2 never",
        says=("ln2",),
    ),
    # Unembed
    Mutant(
        "transformer",
        "return normalized_resid_final @ self.W_U + self.b_U",
        "return normalized_resid_final @ self.W_U",
        "the bias b_U forgotten (zero in GPT-2, not in every model)",
        says=("b_U",),
    ),
    # DemoTransformer
    Mutant(
        "transformer",
        "return self.unembed(self.ln_final(residual))",
        "return self.unembed(residual)",
        "no final LayerNorm before the unembedding",
        says=("ln_final",),
    ),
    Mutant(
        "transformer",
        "residual = self.embed(tokens) + self.pos_embed(tokens)",
        "residual = self.embed(tokens)",
        "the positional embedding forgotten",
        says=("positional embedding",),
    ),
    Mutant(
        "transformer",
        "nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])",
        "nn.ModuleList([TransformerBlock(cfg)] * cfg.n_layers)",
        "one block repeated n_layers times: every layer shares its weights",
        says=("block",),
    ),
    # issue 33: slips a learner's run of the blank notebook made, each to be named
    Mutant(
        "embed",
        "self.W_pos[:seq_len]",
        "self.W_pos[1 : seq_len + 1]",
        "positions counted from 1: each position gets the next position's row",
        says=("count from 0", "row 0"),  # the message's "Positions count from 0"
    ),
    Mutant(
        "mlp",
        "return post @ self.W_out + self.b_out",
        "return post @ self.W_out",
        "the output bias b_out forgotten",
        says=("b_out",),
    ),
    Mutant(
        "mlp",
        "pre = normalized_resid_mid @ self.W_in + self.b_in\n        post = gelu_new(pre)",
        "pre = normalized_resid_mid @ self.W_in\n        post = gelu_new(pre) + self.b_in",
        "b_in added after the GELU",
        says=("b_in", "before the gelu"),
    ),
    Mutant(
        "transformer",
        "for block in self.blocks:\n            residual = block(residual)",
        "for block in self.blocks[:-1]:\n            residual = block(residual)",
        "the last block skipped",
        says=("last block", "every block"),
    ),
    Mutant(
        "transformer",
        "for block in self.blocks:\n            residual = block(residual)",
        "embedded = residual\n"
        "        for block in self.blocks:\n            residual = block(embedded)",
        "every block reads the embeddings, not the previous block's output",
        says=("embeddings", "block to block"),
    ),
]
