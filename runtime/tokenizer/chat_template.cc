#include "runtime/tokenizer/chat_template.h"

#include <vector>

#include "runtime/tokenizer/utf8.h"

namespace chunkserve::tokenizer {
namespace {

// The canonical template texts, with "\n" escapes already turned into newlines.
constexpr std::string_view kChatmlDefaultSystemBefore =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n";
constexpr std::string_view kChatmlDefaultSystemAfter =
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";
constexpr std::string_view kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";
constexpr std::string_view kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
constexpr std::string_view kLlama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] "
    "== 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != "
    "false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] "
    "%}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' "
    "%}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
constexpr std::string_view kMistral =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] "
    "' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}";

constexpr std::string_view kAlternate =
    "Conversation roles must alternate user/assistant/user/assistant/...";

std::string Canonical(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += text[i];
    }
  }
  const size_t b = out.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return out.substr(b, out.find_last_not_of(" \t\r\n") - b + 1);
}

// Python's str.strip(): Unicode whitespace plus the separators \x1c-\x1f.
std::string PyStrip(std::string_view s) {
  const auto is_space = [](char32_t cp) {
    return IsUnicodeWhitespace(cp) || (cp >= 0x1C && cp <= 0x1F);
  };
  size_t begin = 0, end = s.size();
  while (begin < end) {
    char32_t cp;
    const size_t n = DecodeUtf8(s, begin, &cp);
    if (!is_space(cp)) break;
    begin += n;
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    char32_t cp;
    DecodeUtf8(s, start, &cp);
    if (!is_space(cp)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

}  // namespace

Result<ChatTemplate> ChatTemplate::FromJinja(std::string_view jinja_text, std::string bos_token,
                                             std::string eos_token) {
  ChatTemplate t;
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  const std::string text = Canonical(jinja_text);
  if (text.starts_with(kChatmlDefaultSystemBefore) && text.ends_with(kChatmlDefaultSystemAfter) &&
      text.size() >= kChatmlDefaultSystemBefore.size() + kChatmlDefaultSystemAfter.size()) {
    std::string system = text.substr(
        kChatmlDefaultSystemBefore.size(),
        text.size() - kChatmlDefaultSystemBefore.size() - kChatmlDefaultSystemAfter.size());
    // A quote or backslash would end or escape the Jinja string literal: not this template.
    if (system.find_first_of("'\\") == std::string::npos) {
      t.kind_ = Kind::kChatml;
      t.family_ = system.find("SmolLM") != std::string::npos ? "smollm2"
                  : system == "You are a helpful assistant." ? "qwen2"
                                                             : "chatml";
      t.default_system_ = std::move(system);
      return t;
    }
  }
  if (text == kChatml) {
    t.kind_ = Kind::kChatml;
    t.family_ = "chatml";
  } else if (text == kLlama3) {
    t.kind_ = Kind::kLlama3;
    t.family_ = "llama3";
  } else if (text == kLlama2) {
    t.kind_ = Kind::kLlama2;
    t.family_ = "llama2";
  } else if (text == kMistral) {
    t.kind_ = Kind::kMistral;
    t.family_ = "mistral";
  } else {
    std::string seen;
    for (const char* marker : {"<|im_start|>", "<|start_header_id|>", "[INST]", "<<SYS>>",
                               "<start_of_turn>", "<|user|>", "<|assistant|>", "tools"}) {
      if (text.find(marker) != std::string::npos) seen += std::string(seen.empty() ? "" : ", ") + marker;
    }
    return Status::Unimplemented(
        "unrecognized chat template (" + std::to_string(jinja_text.size()) + " bytes, markers: " +
        (seen.empty() ? std::string("none") : seen) + ", starts with '" +
        std::string(text.substr(0, 60)) + "')");
  }
  return t;
}

Result<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                         bool add_generation_prompt) const {
  std::string out;
  switch (kind_) {
    case Kind::kChatml:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0 && default_system_ && messages[0].role != "system") {
          out += "<|im_start|>system\n" + *default_system_ + "<|im_end|>\n";
        }
        out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case Kind::kLlama3:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0) out += bos_;
        out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" +
               PyStrip(messages[i].content) + "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case Kind::kLlama2: {
      if (messages.empty()) {
        return Status::InvalidArgument("the llama2 chat template needs at least one message");
      }
      std::optional<std::string> system;
      std::span<const ChatMessage> loop = messages;
      if (messages[0].role == "system") {
        system = messages[0].content;
        loop = messages.subspan(1);
      }
      for (size_t i = 0; i < loop.size(); ++i) {
        const ChatMessage& m = loop[i];
        if ((m.role == "user") != (i % 2 == 0)) return Status::InvalidArgument(kAlternate);
        std::string content = m.content;
        if (i == 0 && system) content = "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + m.content;
        if (m.role == "user") {
          out += bos_ + "[INST] " + PyStrip(content) + " [/INST]";
        } else if (m.role == "assistant") {
          out += " " + PyStrip(content) + " " + eos_;
        }
      }
      return out;
    }
    case Kind::kMistral:
      out += bos_;
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if ((m.role == "user") != (i % 2 == 0)) return Status::InvalidArgument(kAlternate);
        if (m.role == "user") {
          out += "[INST] " + m.content + " [/INST]";
        } else if (m.role == "assistant") {
          out += m.content + eos_;
        } else {
          return Status::InvalidArgument("Only user and assistant roles are supported!");
        }
      }
      return out;
  }
  return Status::Internal("unknown chat template kind");
}

}  // namespace chunkserve::tokenizer
