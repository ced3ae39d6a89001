// Vocabulary from GGUF tokenizer.ggml.* metadata.
#pragma once

#include "base/status.h"
#include "format/gguf.h"
#include "tokenizer/vocab.h"

namespace mnemo::gguf {

// Reads tokenizer.ggml.{model, pre, tokens, scores, token_type, merges, bos/eos/unk/padding ids,
// add_bos_token, add_eos_token, add_space_prefix} and tokenizer.chat_template. Missing keys take
// llama.cpp's defaults: SPM ("llama") bos 1, eos 2, unk 0, add_bos true, add_space_prefix true;
// BPE ("gpt2") bos = eos = 11, add_bos false (true for the llama-bpe pre-tokenizer),
// add_space_prefix false. Special ids that are out of range (e.g. 0xFFFFFFFF) mean "none" (-1).
// Errors: no tokens, unsupported tokenizer model, array lengths that disagree with the token count,
// BPE without merges. eog_ids: eos, tokenizer.ggml.eot_token_id / eom_token_id, and every token
// whose text llama.cpp treats as end of generation (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, ...).
Result<Vocab> ReadVocab(const GgufFile& f);

}  // namespace mnemo::gguf
