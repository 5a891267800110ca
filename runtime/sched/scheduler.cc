#include "runtime/sched/scheduler.h"

#include <algorithm>
#include <climits>
#include <string>
#include <unordered_map>
#include <utility>

namespace chunkserve::sched {

Scheduler::Scheduler(const SchedulerOptions& options, kv::PrefixTree* tree,
                     forward::StepRunner* runner, FinishHook on_finish)
    : options_(options), tree_(tree), runner_(runner), on_finish_(std::move(on_finish)) {}

int32_t Scheduler::SlotsFor(int32_t tokens) const {
  const int32_t c = tree_->chunk_size();
  return (tokens + c - 1) / c;
}

void Scheduler::Add(Request request) {
  auto live = std::make_unique<Live>(std::move(request));
  live->req.arrival_seq = next_arrival_++;
  live->tokens = live->req.options.prompt;
  live->num_prompt = static_cast<int32_t>(live->tokens.size());
  waiting_.push_back(std::move(live));
}

void Scheduler::Finish(Live* r, FinishReason reason, const Status& error) {
  if (r->finished) return;
  if (r->running) {
    // The sequence is live in the tree by construction; a failure here is a broken invariant,
    // reported through the request rather than lost.
    Status released = tree_->Release(r->seq);
    if (!released.ok() && reason != FinishReason::kError) {
      reason = FinishReason::kError;
      r->running = false;
      Finish(r, reason, released.Annotate("releasing the sequence"));
      return;
    }
    r->running = false;
  }
  r->finished = true;
  FinishInfo info;
  info.reason = reason;
  info.error = error;
  info.prompt_tokens = r->num_prompt;
  info.cached_tokens = std::max(r->cached_tokens, 0);
  info.generated_tokens = r->generated;
  info.queue_seconds = r->queue_seconds;
  pending_finish_.emplace_back(r->req.stream, info);
  ++counters_.finished;
  if (on_finish_) on_finish_(r->req.id);
}

void Scheduler::DeliverFinished() {
  for (auto& [stream, info] : pending_finish_) stream->PushFinish(info);
  pending_finish_.clear();
}

void Scheduler::EraseFinished() {
  auto gone = [](const std::unique_ptr<Live>& r) { return r->finished; };
  running_.erase(std::remove_if(running_.begin(), running_.end(), gone), running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), gone), waiting_.end());
}

void Scheduler::EndExpired(Clock::time_point now) {
  for (auto* list : {&running_, &waiting_}) {
    for (auto& r : *list) {
      if (r->req.stream->cancel_requested()) {
        Finish(r.get(), FinishReason::kCancelled);
      } else if (r->req.options.deadline && now >= *r->req.options.deadline) {
        Finish(r.get(), FinishReason::kDeadline);
      }
    }
  }
  EraseFinished();
}

bool Scheduler::ShouldDefer(const Live& r, int32_t cached) const {
  const int32_t c = tree_->chunk_size();
  for (const auto& p : running_) {
    if (p->decoding()) continue;
    // p is still prefilling: every token of its prompt up to the common prefix will be cached
    // once it has run. Waiting for it saves at least one whole chunk of recomputation.
    const size_t n = std::min(r.tokens.size() - 1, p->tokens.size());
    size_t lcp = 0;
    while (lcp < n && r.tokens[lcp] == p->tokens[lcp]) ++lcp;
    if (static_cast<int32_t>(lcp) >= cached + c && static_cast<int32_t>(lcp) > p->computed) {
      return true;
    }
  }
  return false;
}

void Scheduler::Admit() {
  if (waiting_.empty()) return;
  std::stable_sort(waiting_.begin(), waiting_.end(), [](const auto& a, const auto& b) {
    if (a->req.options.priority != b->req.options.priority) {
      return a->req.options.priority > b->req.options.priority;
    }
    return a->req.arrival_seq < b->req.arrival_seq;
  });
  int32_t reserve = 0;  // slots the running prefills still need
  for (const auto& p : running_) {
    if (!p->decoding()) reserve += SlotsFor(static_cast<int32_t>(p->tokens.size()) - p->computed);
  }
  bool admitted_any = false;
  for (auto& slot : waiting_) {
    if (static_cast<int32_t>(running_.size()) >= options_.max_batch_size) break;
    Live* r = slot.get();
    const int32_t max_cached = static_cast<int32_t>(r->tokens.size()) - 1;
    int32_t cached = 0;
    if (options_.prefix_sharing) {
      cached = tree_->Match(std::span<const TokenId>(r->tokens.data(), max_cached)).num_tokens;
      if (ShouldDefer(*r, cached)) {
        ++counters_.deferred;
        continue;
      }
    }
    // +1: a shared partial tail is copied on the first append.
    const int32_t need = SlotsFor(static_cast<int32_t>(r->tokens.size()) - cached) + 1;
    if (tree_->available_slots() < need + reserve) break;  // strict priority order
    Result<kv::InsertResult> ins =
        tree_->Insert(r->tokens, options_.prefix_sharing ? max_cached : 0);
    if (!ins.ok()) {
      if (ins.status().code() == StatusCode::kResourceExhausted) break;
      Finish(r, FinishReason::kError, ins.status());
      continue;
    }
    r->seq = ins->seq;
    r->computed = ins->num_cached_tokens;
    r->running = true;
    if (ins->copy) pending_copies_.push_back(*ins->copy);
    if (r->cached_tokens < 0) {
      r->cached_tokens = std::min(r->computed, r->num_prompt);
      r->queue_seconds = std::chrono::duration<double>(Clock::now() - r->req.arrival).count();
      counters_.prefix_hit_tokens += r->cached_tokens;
      counters_.prompt_tokens += r->num_prompt;
      ++counters_.admitted;
    }
    reserve += SlotsFor(static_cast<int32_t>(r->tokens.size()) - r->computed);
    running_.push_back(std::move(slot));
    admitted_any = true;
  }
  if (admitted_any) {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), nullptr), waiting_.end());
  }
  EraseFinished();
}

void Scheduler::Preempt(Live* victim) {
  Status released = tree_->Release(victim->seq);
  victim->running = false;
  victim->seq = SeqId();
  victim->computed = 0;
  ++counters_.preemptions;
  if (!released.ok()) {
    Finish(victim, FinishReason::kError, released.Annotate("preempting"));
    EraseFinished();
    return;
  }
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& r) { return r.get() == victim; });
  waiting_.push_back(std::move(*it));
  running_.erase(it);
}

Status Scheduler::Compose(std::vector<Live*>* decode, std::vector<Live*>* prefill,
                          std::vector<int32_t>* prefill_take) {
  for (;;) {
    decode->clear();
    prefill->clear();
    prefill_take->clear();
    append_batch_.clear();
    for (auto& r : running_) {
      if (!r->decoding()) continue;
      r->append_index = static_cast<int32_t>(append_batch_.size());
      append_batch_.push_back({r->seq, std::span<const TokenId>(&r->tokens.back(), 1)});
      decode->push_back(r.get());
    }
    int64_t budget = options_.token_budget > 0 ? options_.token_budget : INT64_MAX;
    budget -= static_cast<int64_t>(decode->size());
    for (auto& r : running_) {
      if (r->decoding() || budget <= 0) continue;
      const int32_t take = static_cast<int32_t>(
          std::min<int64_t>(static_cast<int64_t>(r->tokens.size()) - r->computed, budget));
      budget -= take;
      r->append_index = static_cast<int32_t>(append_batch_.size());
      append_batch_.push_back({r->seq, std::span<const TokenId>(r->tokens.data() + r->computed,
                                                                static_cast<size_t>(take))});
      prefill->push_back(r.get());
      prefill_take->push_back(take);
    }
    if (append_batch_.empty()) return Status::Ok();
    Status s = tree_->Append(append_batch_, &append_);
    if (s.ok()) return s;
    if (s.code() != StatusCode::kResourceExhausted) return s;
    // Out of slots even after evicting every retained chunk: preempt by recompute, lowest
    // priority first, latest arrival first among equals.
    Live* victim = nullptr;
    for (auto& r : running_) {
      if (victim == nullptr || r->req.options.priority < victim->req.options.priority ||
          (r->req.options.priority == victim->req.options.priority &&
           r->req.arrival_seq > victim->req.arrival_seq)) {
        victim = r.get();
      }
    }
    if (running_.size() == 1) {
      // Alone and still without room: Submit's fit check makes this unreachable; end the
      // request with an error rather than loop.
      Finish(victim, FinishReason::kError,
             Status::ResourceExhausted("the KV cache cannot hold this request"));
      EraseFinished();
      continue;
    }
    Preempt(victim);
  }
}

Status Scheduler::Step(Clock::time_point now) {
  EndExpired(now);
  Admit();
  if (!pending_copies_.empty()) {
    // Run the copies of partially matched chunks now: a sequence preempted before the next
    // forward would otherwise leave a retained chunk whose K/V were never copied.
    copy_ops_.clear();
    for (const kv::KvCopy& c : pending_copies_) {
      copy_ops_.push_back(
          {static_cast<int32_t>(c.src.value()), static_cast<int32_t>(c.dst.value()), c.num_tokens});
    }
    pending_copies_.clear();
    forward::StepBatch copies_only;
    copies_only.kv_copies = copy_ops_;
    CHUNKSERVE_RETURN_IF_ERROR(runner_->Forward(copies_only, {}));
  }
  if (running_.empty()) return Status::Ok();

  std::vector<Live*> decode, prefill;
  std::vector<int32_t> take;
  CHUNKSERVE_RETURN_IF_ERROR(Compose(&decode, &prefill, &take));
  if (decode.empty() && prefill.empty()) return Status::Ok();

  // TPP plan over the decode rows; it fixes their order in the batch.
  row_owner_.clear();
  if (!decode.empty()) {
    decode_seqs_.clear();
    for (Live* r : decode) decode_seqs_.push_back(r->seq);
    CHUNKSERVE_RETURN_IF_ERROR(plan_.Update(*tree_, decode_seqs_));
    std::unordered_map<uint32_t, Live*> by_seq;
    by_seq.reserve(decode.size());
    for (Live* r : decode) by_seq.emplace(r->seq.value(), r);
    for (SeqId s : plan_.rows()) {
      auto it = by_seq.find(s.value());
      if (it == by_seq.end()) return Status::Internal("TPP plan row is not a decode sequence");
      row_owner_.push_back(it->second);
    }
  }

  step_tokens_.clear();
  step_pos_.clear();
  step_slot_.clear();
  step_offset_.clear();
  logit_rows_.clear();
  logit_owner_.clear();
  auto add_token = [&](Live* r, int32_t i, int32_t write) {
    const kv::KvWrite& w = append_.writes[write];
    step_tokens_.push_back(r->tokens[i]);
    step_pos_.push_back(w.position);
    step_slot_.push_back(static_cast<int32_t>(w.slot.value()));
    step_offset_.push_back(w.offset);
  };
  for (Live* r : row_owner_) {
    logit_rows_.push_back(static_cast<int32_t>(step_tokens_.size()));
    logit_owner_.push_back(r);
    add_token(r, r->computed, append_.write_indptr[r->append_index]);
  }
  // Prefill segments with their whole chunk paths (after this step's appends).
  segments_.clear();
  path_slots_.clear();
  path_lens_.clear();
  std::vector<std::pair<size_t, size_t>> path_ranges;
  for (size_t k = 0; k < prefill.size(); ++k) {
    Live* r = prefill[k];
    forward::PrefillSegment seg;
    seg.token_begin = static_cast<int32_t>(step_tokens_.size());
    seg.num_tokens = take[k];
    const int32_t first_write = append_.write_indptr[r->append_index];
    for (int32_t i = 0; i < take[k]; ++i) add_token(r, r->computed + i, first_write + i);
    if (r->computed + take[k] == static_cast<int32_t>(r->tokens.size())) {
      logit_rows_.push_back(static_cast<int32_t>(step_tokens_.size()) - 1);
      logit_owner_.push_back(r);
    }
    CHUNKSERVE_ASSIGN_OR_RETURN(kv::SeqInfo info, tree_->Seq(r->seq));
    const size_t begin = path_slots_.size();
    for (ChunkId c : info.path) {
      path_slots_.push_back(static_cast<int32_t>(tree_->ChunkSlot(c).value()));
      path_lens_.push_back(tree_->ChunkLen(c));
    }
    path_ranges.emplace_back(begin, path_slots_.size() - begin);
    segments_.push_back(seg);
  }
  for (size_t k = 0; k < segments_.size(); ++k) {  // spans only once the vectors stopped growing
    segments_[k].chunk_slots =
        std::span<const int32_t>(path_slots_).subspan(path_ranges[k].first, path_ranges[k].second);
    segments_[k].chunk_lens =
        std::span<const int32_t>(path_lens_).subspan(path_ranges[k].first, path_ranges[k].second);
  }
  copy_ops_.clear();
  for (const kv::KvCopy& c : append_.copies) {
    copy_ops_.push_back(
        {static_cast<int32_t>(c.src.value()), static_cast<int32_t>(c.dst.value()), c.num_tokens});
  }

  forward::StepBatch batch;
  batch.tokens = step_tokens_;
  batch.positions = step_pos_;
  batch.kv_slot = step_slot_;
  batch.kv_offset = step_offset_;
  batch.num_decode = static_cast<int32_t>(row_owner_.size());
  if (batch.num_decode > 0) batch.decode_plan = plan_.view();
  batch.prefill = segments_;
  batch.logit_rows = logit_rows_;
  batch.kv_copies = copy_ops_;
  // One draw per non-greedy token, on the host, in logit-row order: the tokens depend on the
  // seeds and the logits only, whichever backend samples.
  sample_rows_.clear();
  for (Live* r : logit_owner_) {
    const SamplingParams& p = r->sampler.params();
    sample_rows_.push_back({.temperature = p.temperature,
                            .top_k = p.top_k,
                            .top_p = p.top_p,
                            .uniform = r->sampler.Draw(),
                            .logprobs = r->req.options.logprobs});
  }
  sampled_.resize(logit_owner_.size());
  sampled_logprobs_.resize(logit_owner_.size());
  CHUNKSERVE_RETURN_IF_ERROR(
      runner_->ForwardSample(batch, sample_rows_, sampled_, sampled_logprobs_));

  ++counters_.steps;
  counters_.last_batch_tokens = static_cast<int32_t>(step_tokens_.size());
  counters_.last_decode_rows = batch.num_decode;
  counters_.decode_tokens += decode.size();
  for (Live* r : decode) r->computed += 1;
  for (size_t k = 0; k < prefill.size(); ++k) {
    prefill[k]->computed += take[k];
    counters_.prefill_tokens += take[k];
  }

  for (size_t k = 0; k < logit_owner_.size(); ++k) {
    Live* r = logit_owner_[k];
    const TokenId t = sampled_[k];
    r->tokens.push_back(t);
    std::optional<TokenLogprobs> logprobs;
    if (r->req.options.logprobs >= 0) logprobs = std::move(sampled_logprobs_[k]);
    r->req.stream->PushToken(t, r->generated, std::move(logprobs));
    ++r->generated;
    ++counters_.generated_tokens;
    const auto& stops = r->req.options.stop_tokens;
    if (std::find(stops.begin(), stops.end(), t) != stops.end()) {
      Finish(r, FinishReason::kStopToken);
    } else if (r->generated >= r->req.options.max_new_tokens ||
               (options_.max_context > 0 &&
                static_cast<int32_t>(r->tokens.size()) >= options_.max_context)) {
      Finish(r, FinishReason::kLength);
    }
  }
  EraseFinished();
  return Status::Ok();
}

void Scheduler::AbortAll(FinishReason reason, const Status& error) {
  for (auto* list : {&running_, &waiting_}) {
    for (auto& r : *list) Finish(r.get(), reason, error);
  }
  EraseFinished();
}

int64_t Scheduler::PrefillProgressTokens() const {
  int64_t done = 0;
  for (const auto& r : running_) {
    if (r->running && !r->finished && r->generated == 0) {
      done += std::max(0, std::min(r->computed, r->num_prompt) - std::max(0, r->cached_tokens));
    }
  }
  return done;
}

}  // namespace chunkserve::sched
