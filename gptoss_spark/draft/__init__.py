"""Eagle3 draft head tools: cut the draft lm_head to the tokens the target emits most.

    counts    token frequencies: gather from the served target, read/write files
    head      read an Eagle3 head directory (config keys, tensors, draft->target map)
    shrink    keep the top-K rows of lm_head, write d2t/t2d and config, check the result
    verify    check a head directory is consistent the way vLLM 0.32.0 reads it
    cli       its commands: register(subparsers) (`gptoss-spark draft counts|shrink|verify`)

vLLM 0.32.0 format (vllm/model_executor/models/llama_eagle3.py, Eagle3LlamaForCausalLM):
- config `draft_vocab_size` = rows of lm_head (absent: equals `vocab_size`);
  `vocab_size` stays the target's vocabulary (logits are scattered back into it).
  Speculators-format configs keep `draft_vocab_size` at the top level and
  `vocab_size` under `transformer_layer_config`.
- tensor `d2t`: int64, shape [draft_vocab_size], an OFFSET per draft row:
  target_id = draft_id + d2t[draft_id]. Loaded as `draft_id_to_target_id`;
  required whenever draft_vocab_size != the target's vocab size.
- tensor `t2d`: skipped by vLLM; EAGLE-3 training code writes it as a bool mask
  over the target vocabulary (True = kept). Written for other readers.
torch and safetensors are imported only inside functions that need them.
"""
