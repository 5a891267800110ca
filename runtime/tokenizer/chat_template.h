// Chat templates: a conversation -> the prompt text, exactly as transformers' apply_chat_template
// renders the model's Jinja template. There is no Jinja interpreter here: the template text is
// recognized as one of the known families and rendered by hand-written code for that family.
//
// Recognition compares the template (with "\n" escapes read as newlines, surrounding whitespace
// trimmed) with the canonical texts of:
//   "chatml"   <|im_start|>role\ncontent<|im_end|>\n per message; generation prompt
//              <|im_start|>assistant\n. The variant that inserts a default system message when the
//              first message is not a system one is "smollm2" when that message names SmolLM,
//              "qwen2" for Qwen2's "You are a helpful assistant.", else "chatml"; default_system()
//              holds it.
//   "llama3"   bos + <|start_header_id|>role<|end_header_id|>\n\n trim(content) <|eot_id|>.
//   "llama2"   [INST] <<SYS>> ... [/INST] with bos before each user turn, eos after each answer;
//              roles must alternate user/assistant (after an optional leading system message).
//   "mistral"  bos [INST] user [/INST]answer eos ...; only user/assistant, alternating.
// Any other template is Unimplemented, naming the markers it contains. Where the Jinja template
// calls raise_exception, Render returns InvalidArgument with the template's message.
//
// Thread safety: immutable after construction.
#ifndef CHUNKSERVE_RUNTIME_TOKENIZER_CHAT_TEMPLATE_H_
#define CHUNKSERVE_RUNTIME_TOKENIZER_CHAT_TEMPLATE_H_

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "runtime/base/status.h"

namespace chunkserve::tokenizer {

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> FromJinja(std::string_view jinja_text, std::string bos_token,
                                        std::string eos_token);

  Result<std::string> Render(std::span<const ChatMessage> messages,
                             bool add_generation_prompt) const;

  // "chatml", "smollm2", "qwen2", "llama3", "llama2" or "mistral".
  std::string_view family() const { return family_; }
  // The system message the template inserts when the conversation has none (chatml family).
  const std::optional<std::string>& default_system() const { return default_system_; }

 private:
  enum class Kind { kChatml, kLlama3, kLlama2, kMistral };
  Kind kind_ = Kind::kChatml;
  std::string family_;
  std::optional<std::string> default_system_;
  std::string bos_;
  std::string eos_;
};

}  // namespace chunkserve::tokenizer

#endif  // CHUNKSERVE_RUNTIME_TOKENIZER_CHAT_TEMPLATE_H_
