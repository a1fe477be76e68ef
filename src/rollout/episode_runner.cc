#include "rollout/episode_runner.h"

#include <fmt/format.h>

#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "common/logging.h"

namespace gyre::rollout {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// The runner's view of one episode.
struct State {
  Episode* ep = nullptr;
  std::string session;
  json messages = json::array();  // the conversation as rendered (model turns as sentinels)
  std::string tools_json;
  Clock::time_point deadline;
  int64_t turn_begin = 0;  // response index where the current model turn began
  bool done = false;
  // The environment call in flight, if any, and its cancellation.
  std::future<Status> call;
  std::unique_ptr<rpc::Cancellation> cancel = std::make_unique<rpc::Cancellation>();
  bool step_cut_by_deadline = false;  // the call's deadline was the episode's
  std::unique_ptr<v1::StepRequest> step_req;
  std::unique_ptr<v1::StepResponse> step_resp;
};

json MessagesJson(const v1::Observation& obs) {
  json out = json::array();
  for (const v1::EnvMessage& m : obs.messages()) {
    json j = {{"role", m.role()}, {"content", m.content()}};
    if (!m.name().empty()) j["name"] = m.name();
    if (!m.tool_call_id().empty()) j["tool_call_id"] = m.tool_call_id();
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace

StatusOr<std::vector<Episode>> EpisodeRunner::Run(std::vector<Episode> episodes) {
  if (!engine_->idle()) return FailedPrecondition("EpisodeRunner::Run needs an idle engine");
  const int64_t limit = options_.sampling.max_new_tokens;
  // A sentinel in place of each model turn when rendering: only what the template puts around
  // the turns is taken from a rendering, never the turns themselves.
  std::mt19937_64 rng(std::random_device{}());
  const std::string sentinel = fmt::format("GYRETURN{:016x}", rng());

  std::vector<State> states(episodes.size());
  // Closes run in the background (a dead server's would wait for its restart); their futures
  // are kept so that Run returns only after all of them.
  std::vector<std::future<void>> closes;
  auto close = [&](const std::string& session, const std::string& reason) {
    closes.push_back(
        std::async(std::launch::async, [this, session, reason] { env_->Close(session, reason); }));
  };
  // env_error: the environment (or rendering its messages) failed, not a limit.
  auto finish = [&](State& st, bool terminated, const std::string& why, bool env_error = false) {
    st.done = true;
    st.ep->env_error = env_error;
    st.ep->terminated = terminated;
    st.ep->truncated = !terminated;
    st.ep->status = why;
    close(st.session, terminated ? "" : "limit");
  };

  // Reset every episode (environment calls in parallel, env_concurrency at a time).
  const size_t wave = static_cast<size_t>(std::max(1, options_.env_concurrency));
  std::vector<Request> requests;
  for (size_t w0 = 0; w0 < episodes.size(); w0 += wave) {
    std::vector<std::pair<size_t, std::future<Status>>> calls;
    std::vector<v1::ResetResponse> resets(std::min(wave, episodes.size() - w0));
    for (size_t i = w0; i < std::min(episodes.size(), w0 + wave); ++i) {
      State& st = states[i];
      st.ep = &episodes[i];
      st.session = "ep-" + std::to_string(st.ep->id);
      st.deadline = Clock::now() + std::chrono::milliseconds(
                                       static_cast<int64_t>(options_.episode_timeout_s * 1000));
      v1::ResetRequest req;
      req.set_session_id(st.session);
      req.set_task_json(st.ep->task_json);
      req.set_seed(st.ep->seed);
      req.set_episode_timeout_s(options_.episode_timeout_s);
      v1::ResetResponse* out = &resets[i - w0];
      calls.emplace_back(
          i, std::async(std::launch::async, [this, req, out] { return env_->Reset(req, out); }));
    }
    for (auto& [i, f] : calls) {
      State& st = states[i];
      Status s = f.get();
      const v1::ResetResponse& r = resets[i - w0];
      StatusOr<std::vector<int32_t>> prompt = std::vector<int32_t>{};
      if (s.ok()) {
        st.tools_json = r.tools_json().empty() ? "" : r.tools_json();
        if (!r.observation().token_ids().empty()) {
          prompt = std::vector<int32_t>(r.observation().token_ids().begin(),
                                        r.observation().token_ids().end());
        } else {
          st.messages = MessagesJson(r.observation());
          auto text = render_(st.messages.dump(), st.tools_json, true);
          prompt = text.ok() ? encode_(*text) : StatusOr<std::vector<int32_t>>(text.status());
        }
      }
      if (!s.ok() || !prompt.ok()) {
        const Status err = !s.ok() ? s : prompt.status().WithContext("rendering the prompt");
        st.done = true;
        st.ep->failed = true;
        st.ep->env_error = true;
        st.ep->truncated = true;
        st.ep->status = "reset failed: " + err.ToString();
        close(st.session, "cancelled");
        continue;
      }
      if (options_.bos_id >= 0) prompt->insert(prompt->begin(), options_.bos_id);
      st.ep->prompt = *prompt;
      Request q;
      q.id = i;
      q.group = st.ep->group;
      q.prompt = *prompt;
      q.seed = st.ep->seed;
      q.sampling = options_.sampling;
      q.park_on_finish = true;
      requests.push_back(std::move(q));
    }
  }
  // Episodes whose prompt the engine refuses (too long, bad ids) end here; the rest start.
  for (Request& q : requests) {
    Status s = engine_->Add({q});
    if (!s.ok()) {
      State& st = states[q.id];
      st.ep->failed = true;
      finish(st, false, "prompt refused: " + s.ToString());
    }
  }

  // Steps wait here while env_concurrency calls are in flight (a server refuses calls past its
  // own limit).
  std::deque<State*> waiting_steps;
  int in_flight = 0;
  // A turn ended: send it to the environment.
  std::function<void(State&)> start_step;
  auto queue_step = [&](State& st) {
    if (in_flight < static_cast<int>(wave)) {
      start_step(st);
    } else {
      waiting_steps.push_back(&st);
    }
  };
  start_step = [&](State& st) {
    ++in_flight;
    const std::vector<int32_t> turn(st.ep->response.tokens.begin() + st.turn_begin,
                                    st.ep->response.tokens.end());
    const std::string text = decode_(turn);
    text::ParsedToolCalls parsed = text::ParseToolCalls(text, options_.tool_format);
    auto req = std::make_unique<v1::StepRequest>();
    req->set_session_id(st.session);
    req->set_step_index(static_cast<int32_t>(st.ep->turns.size()) - 1);
    req->set_action_text(text);
    for (int32_t t : turn) req->add_action_token_ids(t);
    for (size_t k = 0; k < parsed.calls.size(); ++k) {
      v1::EnvToolCall* c = req->add_tool_calls();
      c->set_id(fmt::format("call-{}-{}", st.ep->turns.size(), k));
      c->set_name(parsed.calls[k].name);
      c->set_arguments_json(parsed.calls[k].arguments);
    }
    std::string errors;
    for (const auto& e : parsed.errors) errors += (errors.empty() ? "" : "\n") + e;
    req->set_tool_call_error(errors);
    st.step_req = std::move(req);
    st.step_resp = std::make_unique<v1::StepResponse>();
    const v1::StepRequest* rq = st.step_req.get();
    v1::StepResponse* rs = st.step_resp.get();
    rpc::Cancellation* cancel = st.cancel.get();
    // The step may take what is left of the episode's time, and no more.
    const double left = std::chrono::duration<double>(st.deadline - Clock::now()).count();
    const double step_s = env_->timeouts().step_s;
    st.step_cut_by_deadline = left < step_s;
    const double timeout = std::max(0.001, std::min(left, step_s));
    st.call = std::async(std::launch::async, [this, rq, rs, cancel, timeout] {
      return env_->Step(*rq, rs, cancel, timeout);
    });
  };

  // The environment answered: append its observation and continue, or end the episode.
  auto observe = [&](State& st) {
    Status s = st.call.get();
    --in_flight;
    if (!waiting_steps.empty()) {
      State* next = waiting_steps.front();
      waiting_steps.pop_front();
      start_step(*next);
    }
    Episode& ep = *st.ep;
    if (s.code() == StatusCode::kDeadlineExceeded && st.step_cut_by_deadline) {
      return finish(st, false, fmt::format("episode timeout ({:g} s)", options_.episode_timeout_s));
    }
    if (!s.ok()) return finish(st, false, "environment: " + s.ToString(), true);
    const v1::StepResponse& r = *st.step_resp;
    ep.reward += r.reward();
    ep.turns.back().reward = r.reward();
    if (r.terminated()) return finish(st, true, "");
    if (r.truncated()) return finish(st, false, "the environment truncated the episode");
    if (static_cast<int>(ep.turns.size()) >= options_.max_turns) {
      return finish(st, false, fmt::format("turn limit (max_turns {})", options_.max_turns));
    }
    if (Clock::now() > st.deadline) {
      return finish(st, false, fmt::format("episode timeout ({:g} s)", options_.episode_timeout_s));
    }
    std::vector<int32_t> inserted;
    if (!r.observation().token_ids().empty()) {
      inserted.assign(r.observation().token_ids().begin(), r.observation().token_ids().end());
    } else {
      // What the template writes after the model's turn and before the next one.
      json before = st.messages;
      before.push_back({{"role", "assistant"}, {"content", sentinel}});
      const json observation = MessagesJson(r.observation());
      auto text = text::TextBetweenTurns(render_, before.dump(), observation.dump(), st.tools_json,
                                         sentinel, options_.end_of_turn_text);
      if (!text.ok()) {
        return finish(st, false, "rendering the observation: " + text.status().ToString(), true);
      }
      json after = std::move(before);
      for (const json& m : observation) after.push_back(m);
      auto ids = encode_(*text);
      if (!ids.ok())
        return finish(st, false, "encoding the observation: " + ids.status().ToString(), true);
      inserted = std::move(*ids);
      st.messages = std::move(after);
    }
    const int64_t len = static_cast<int64_t>(ep.response.tokens.size() + inserted.size());
    if (len >= limit) {
      return finish(st, false, fmt::format("token limit (max_new_tokens {})", limit));
    }
    for (int32_t t : inserted) {
      ep.response.tokens.push_back(t);
      ep.response.logprobs.push_back(0.0f);
      ep.response.kept_mass.push_back(1.0f);
      ep.response.versions.push_back(engine_->version());
      ep.loss_mask.push_back(0.0f);
    }
    ep.turns.back().observation_end = len;
    Request q;
    q.id = static_cast<uint64_t>(st.ep - episodes.data());
    q.group = ep.group;
    q.prompt = ep.prompt;
    q.seed = ep.seed;
    q.sampling = options_.sampling;
    q.resume = ep.response;
    q.stop_scan_from = static_cast<int32_t>(len);
    q.park_on_finish = true;
    Status added = engine_->Add({q});
    if (!added.ok()) return finish(st, false, "continuation refused: " + added.ToString());
    st.turn_begin = len;
  };

  auto active = [&] {
    for (const State& st : states) {
      if (!st.done) return true;
    }
    return false;
  };
  while (active()) {
    bool progressed = false;
    for (State& st : states) {
      if (!st.done && st.call.valid() &&
          st.call.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        observe(st);
        progressed = true;
      }
    }
    if (!engine_->idle()) {
      auto finished = engine_->Step();
      if (!finished.ok()) {
        engine_->DropAll();
        engine_->ClearParked();
        for (State& st : states) {
          if (st.call.valid()) {
            st.cancel->Cancel();  // environment calls in flight end now
            st.call.wait();
          }
          if (!st.done) close(st.session, "cancelled");
        }
        return finished.status();
      }
      for (SampleResult& r : *finished) {
        State& st = states[r.id];
        Episode& ep = *st.ep;
        ep.response = std::move(r.response);
        ep.loss_mask.resize(ep.response.tokens.size(), 1.0f);
        TurnRecord turn;
        turn.begin = st.turn_begin;
        turn.end = turn.observation_end = static_cast<int64_t>(ep.response.tokens.size());
        ep.turns.push_back(turn);
        if (r.finish != Finish::kStop) {
          finish(st, false, fmt::format("token limit (max_new_tokens {})", limit));
        } else if (Clock::now() > st.deadline) {
          finish(st, false, fmt::format("episode timeout ({:g} s)", options_.episode_timeout_s));
        } else {
          queue_step(st);
        }
      }
      progressed = true;
    }
    if (!progressed) {
      // Only environment calls are outstanding: wait for one.
      bool waiting = false;
      for (State& st : states) {
        if (!st.done && st.call.valid()) {
          st.call.wait_for(std::chrono::milliseconds(5));
          waiting = true;
          break;
        }
      }
      if (!waiting) return Internal("EpisodeRunner: an episode is neither generating nor waiting");
    }
  }
  engine_->ClearParked();
  for (auto& c : closes) c.wait();
  return episodes;
}

}  // namespace gyre::rollout
