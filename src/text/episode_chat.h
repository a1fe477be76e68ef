#pragma once
// EpisodeChat: a chat template as multi-turn episodes use it (env.chat_template, docs/agents.md),
// and the two renderings built on it:
//   - TextBetweenTurns: what the template writes between the end of one model turn and the start
//     of the next (the environment's observation with the template's markup around it). Only this
//     text is encoded into a trajectory; the model's own tokens never are.
//   - RenderDemonstration: a whole demonstration conversation cut into the prompt, the model's
//     turns and the text between them, for the supervised warm-up of an environment job. It cuts
//     exactly where an episode does, so the warm-up teaches the token layout that rollouts produce.
// A model turn is rendered as an assistant message whose content is a sentinel string, and only
// the text around the sentinel is used, so a template's handling of assistant content (thinking
// blocks, tool-call markup) never leaks into the inserted text.
//
// Thread contract: an EpisodeChat is immutable after Load and safe to share.

#include <functional>
#include <string>
#include <vector>

#include "gyre/status.h"
#include "text/jinja.h"

namespace gyre::text {

// messages (JSON array), tools (JSON array or ""), add_generation_prompt -> the template's text.
using ChatRenderFn = std::function<StatusOr<std::string>(
    const std::string& messages_json, const std::string& tools_json, bool add_generation_prompt)>;

class EpisodeChat {
 public:
  // `template_path`: a Jinja file; empty = the model directory's own template (LoadChatTemplate).
  // `kwargs_json`: extra template variables (a JSON object, or "" for none), e.g.
  // {"enable_thinking": false}. Errors name the file or say which setting to change.
  static StatusOr<EpisodeChat> Load(const std::string& template_path, const std::string& model_dir,
                                    const std::string& kwargs_json);

  StatusOr<std::string> Render(const std::string& messages_json, const std::string& tools_json,
                               bool add_generation_prompt) const;
  // Render as a ChatRenderFn (holds a copy of this EpisodeChat).
  ChatRenderFn AsFunction() const;

 private:
  EpisodeChat(ChatTemplate t, std::string kwargs)
      : template_(std::move(t)), kwargs_(std::move(kwargs)) {}
  ChatTemplate template_;
  std::string kwargs_;
};

// The text between a model turn and the next: `conversation_json` holds the messages up to and
// including the model's turn, an assistant message whose content is `sentinel`;
// `observation_json` the messages that follow it (a JSON array). The result is the rendering's
// text after the sentinel, without `end_of_turn_text` at its start (the model's stop token wrote
// that), followed by what the observation and the next generation prompt add. An error when
// the template does not render the observation as a continuation of the conversation.
StatusOr<std::string> TextBetweenTurns(const ChatRenderFn& render,
                                       const std::string& conversation_json,
                                       const std::string& observation_json,
                                       const std::string& tools_json, const std::string& sentinel,
                                       const std::string& end_of_turn_text);

// A demonstration cut as an episode would produce it: `prompt` is the rendering of the messages
// before the first assistant message (with the generation prompt); then, in order, each
// assistant message's content (model = true: the model writes it, then its stop token) and the
// text between it and the next assistant message (model = false). Messages after the last
// assistant message are not used.
struct DemoPiece {
  std::string text;
  bool model = false;
};
struct RenderedDemo {
  std::string prompt;
  std::vector<DemoPiece> pieces;
};
// `messages_json`: a JSON array of {role, content, ...} with at least one assistant message and
// at least one message before the first; errors say which message is wrong.
StatusOr<RenderedDemo> RenderDemonstration(const ChatRenderFn& render,
                                           const std::string& messages_json,
                                           const std::string& tools_json,
                                           const std::string& end_of_turn_text);

}  // namespace gyre::text
