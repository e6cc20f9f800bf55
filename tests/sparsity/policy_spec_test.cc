// Policy strings and JSON: parsing, defaults, canonical printing and round trips, errors that
// name the problem; resolution to per-(layer, KV head) plans.
#include "sparsity/policy_spec.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "sparsity/controller.h"

#include "sparsity/calibration.h"
#include "error_of.h"
#include "util/error.h"

namespace sieve::sparsity {
namespace {

using sieve::testing::error_of;

TEST(PolicySpec, ParsesEveryLeafPolicyWithItsParameters) {
  EXPECT_EQ(parse_policy("full"), (PolicySpec{FullSpec{}}));
  EXPECT_EQ(parse_policy("streaming:S=4,W=256"), (PolicySpec{StreamingSpec{4, 256}}));
  EXPECT_EQ(parse_policy("h2o:B=256,W=32"), (PolicySpec{H2OSpec{256, 32}}));
  EXPECT_EQ(parse_policy("snapkv:B=512,W=16,P=5,pool=avg"),
            (PolicySpec{SnapKvSpec{512, 16, 5, Pooling::kAvg}}));
  EXPECT_EQ(parse_policy("pyramidkv:B=512,W=32,P=7,pool=max,beta=10"),
            (PolicySpec{PyramidKvSpec{SnapKvSpec{512, 32, 7, Pooling::kMax}, 10.0}}));
  EXPECT_EQ(parse_policy("fastgen:T=0.02,W=100,F=0.25"),
            (PolicySpec{FastGenSpec{0.02, 100, 0.25}}));
  EXPECT_EQ(parse_policy("quest:K=64,R=2,S=8,W=48"), (PolicySpec{QuestSpec{64, 2, 8, 48}}));
  EXPECT_EQ(parse_policy("lserve:K=32,R=4,S=4,W=256,f=0.5"),
            (PolicySpec{LServeSpec{QuestSpec{32, 4, 4, 256}, 0.5}}));
  // Parameter order does not matter.
  EXPECT_EQ(parse_policy("streaming:W=256,S=4"), parse_policy("streaming:S=4,W=256"));
}

TEST(PolicySpec, OmittedParametersTakeTheirDefaults) {
  EXPECT_EQ(parse_policy("streaming:W=64"), (PolicySpec{StreamingSpec{4, 64}}));
  EXPECT_EQ(parse_policy("streaming"), (PolicySpec{StreamingSpec{4, 256}}));
  EXPECT_EQ(parse_policy("h2o:B=100"), (PolicySpec{H2OSpec{100, 32}}));
  EXPECT_EQ(parse_policy("snapkv:B=256"), (PolicySpec{SnapKvSpec{256, 32, 7, Pooling::kMax}}));
  EXPECT_EQ(parse_policy("pyramidkv:B=256"),
            (PolicySpec{PyramidKvSpec{SnapKvSpec{256, 32, 7, Pooling::kMax}, 20.0}}));
  EXPECT_EQ(parse_policy("fastgen"), (PolicySpec{FastGenSpec{0.05, 64, 0.10}}));
  EXPECT_EQ(parse_policy("quest:K=16"), (PolicySpec{QuestSpec{16, 1, 4, 32}}));
  EXPECT_EQ(parse_policy("lserve:K=16"), (PolicySpec{LServeSpec{QuestSpec{16, 4, 4, 32}, 0.5}}));
}

TEST(PolicySpec, CompositionsNest) {
  const PolicySpec layerwise = parse_policy("layerwise:L=3,rest=snapkv:B=512,W=16");
  const auto& lw = std::get<LayerwiseSpec>(layerwise.policy);
  EXPECT_EQ(lw.num_full_layers, 3);
  EXPECT_EQ(*lw.rest, (PolicySpec{SnapKvSpec{512, 16, 7, Pooling::kMax}}));
  // rest in parentheses may be followed by more items.
  EXPECT_EQ(parse_policy("layerwise:rest=(snapkv:B=512,W=16),L=3"), layerwise);

  const PolicySpec heads = parse_policy("heads:streaming@profile=0.5,rest=snapkv:B=256");
  const auto& hs = std::get<HeadsSpec>(heads.policy);
  ASSERT_EQ(hs.groups.size(), 1u);
  EXPECT_EQ(*hs.groups[0].policy, (PolicySpec{StreamingSpec{4, 256}}));
  EXPECT_TRUE(std::holds_alternative<ProfileFraction>(hs.groups[0].selector));
  EXPECT_EQ(std::get<ProfileFraction>(hs.groups[0].selector).fraction, 0.5);
  EXPECT_EQ(*hs.rest, (PolicySpec{SnapKvSpec{256, 32, 7, Pooling::kMax}}));

  const PolicySpec explicit_heads =
      parse_policy("heads:(streaming:S=2,W=64)@kv=0+2-3,(h2o:B=8,W=8)@kv=1");
  const auto& eh = std::get<HeadsSpec>(explicit_heads.policy);
  ASSERT_EQ(eh.groups.size(), 2u);
  EXPECT_EQ(*eh.groups[0].policy, (PolicySpec{StreamingSpec{2, 64}}));
  EXPECT_EQ(std::get<IndexList>(eh.groups[0].selector).indices, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(std::get<IndexList>(eh.groups[1].selector).indices, (std::vector<int64_t>{1}));
  EXPECT_EQ(*eh.rest, (PolicySpec{FullSpec{}}));  // default rest

  const PolicySpec layers = parse_policy("layers:full@0-1,(h2o:B=64)@4+3,rest=snapkv:B=32");
  const auto& ls = std::get<LayersSpec>(layers.policy);
  ASSERT_EQ(ls.groups.size(), 2u);
  EXPECT_EQ(ls.groups[1].layers.indices, (std::vector<int64_t>{3, 4}));
}

TEST(PolicySpec, CanonicalStringsRoundTrip) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"full", "full"},
      {"streaming:W=256", "streaming:S=4,W=256"},
      {"h2o:B=256,W=32", "h2o:B=256,W=32"},
      {"snapkv:B=512", "snapkv:B=512,W=32,P=7,pool=max"},
      {"snapkv:G=11,B=512", "snapkv:B=512,W=32,P=7,pool=max,G=11"},
      {"pyramidkv:B=64,G=4", "pyramidkv:B=64,W=32,P=7,pool=max,G=4,beta=20"},
      {"pyramidkv:B=512,beta=7.5,pool=avg", "pyramidkv:B=512,W=32,P=7,pool=avg,beta=7.5"},
      {"fastgen:T=0.05,W=64,F=0.1", "fastgen:T=0.05,W=64,F=0.1"},
      {"quest:K=64,R=4", "quest:K=64,R=4,S=4,W=32"},
      {"lserve:K=64,f=0.25", "lserve:K=64,R=4,S=4,W=32,f=0.25"},
      {"layerwise:L=3,rest=snapkv:B=512", "layerwise:L=3,rest=snapkv:B=512,W=32,P=7,pool=max"},
      {"heads:streaming@profile=0.5,rest=snapkv:B=256",
       "heads:(streaming:S=4,W=256)@profile=0.5,rest=snapkv:B=256,W=32,P=7,pool=max"},
      {"heads:(h2o:B=8)@kv=3+0+1,rest=full", "heads:(h2o:B=8,W=32)@kv=0-1+3,rest=full"},
      {"layers:full@0-2,rest=layerwise:L=1,rest=streaming:W=9",
       "layers:(full)@0-2,rest=layerwise:L=1,rest=streaming:S=4,W=9"},
  };
  for (const auto& [input, canonical] : cases) {
    const PolicySpec spec = parse_policy(input);
    EXPECT_EQ(to_string(spec), canonical) << input;
    EXPECT_EQ(parse_policy(to_string(spec)), spec) << input;
    EXPECT_EQ(parse_policy_json(to_json(spec)), spec) << input << " via " << to_json(spec);
  }
  const PolicySpec spec = parse_policy("heads:(streaming:W=64)@profile=0.5,rest=snapkv:B=256");
  EXPECT_EQ(to_string(spec),
            "heads:(streaming:S=4,W=64)@profile=0.5,rest=snapkv:B=256,W=32,P=7,"
            "pool=max");
  EXPECT_EQ(parse_policy(to_string(spec)), spec);
  EXPECT_EQ(parse_policy("heads:full@profile=0.5,rest=snapkv:B=256"),
            parse_policy("heads:(full)@profile=0.5,rest=(snapkv:B=256)"));
}

TEST(PolicySpec, JsonFormIsTheSameSpec) {
  EXPECT_EQ(parse_policy_json(R"({"name": "snapkv", "B": 512, "pool": "avg"})"),
            parse_policy("snapkv:B=512,pool=avg"));
  EXPECT_EQ(
      parse_policy_json(R"({"name": "layerwise", "L": 3, "rest": {"name": "snapkv", "B": 512}})"),
      parse_policy("layerwise:L=3,rest=snapkv:B=512"));
  EXPECT_EQ(parse_policy_json(R"({"name": "layerwise", "L": 3, "rest": "h2o:B=64,W=8"})"),
            parse_policy("layerwise:L=3,rest=h2o:B=64,W=8"));
  EXPECT_EQ(parse_policy_json(R"("fastgen:T=0.1")"), parse_policy("fastgen:T=0.1"));
  EXPECT_EQ(parse_policy_json(R"({"name": "heads", "groups": [
                {"policy": {"name": "streaming", "W": 64}, "profile": 0.5},
                {"policy": "h2o:B=16", "kv": [1, 3]}],
              "rest": {"name": "quest", "K": 8}})"),
            parse_policy("heads:(streaming:W=64)@profile=0.5,(h2o:B=16)@kv=1+3,rest=quest:K=8"));
  EXPECT_EQ(parse_policy_json(R"({"name": "layers", "groups": [{"policy": "full", "layers": [0]}],
                                  "rest": "streaming:W=4"})"),
            parse_policy("layers:full@0,rest=streaming:W=4"));
  EXPECT_EQ(parse_policy_json(R"({"name": "lserve", "K": 16, "f": 0.75})"),
            parse_policy("lserve:K=16,f=0.75"));
}

TEST(PolicySpec, ErrorsNameTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {"snapkv", "missing B"},
      {"snapkv:B=abc", "B must be a non-negative integer, got \"abc\""},
      {"snapkv:B=-5", "B must be a non-negative integer"},
      {"snapkv:B=0", "B must be >= 1"},
      {"snapkv:B=99999999999999999999", "B must be a non-negative integer"},
      {"snapkv:B=5,B=6", "B given twice"},
      {"snapkv:B=5,X=1", "unknown parameter \"X\" (expected B, W, P, pool, G)"},
      {"adakv:B=5,G=3", "unknown parameter \"G\""},
      {"snapkv:B=5,G=-1", "G must be a non-negative integer"},
      {"snapkv:B=5,P=4", "P must be odd"},
      {"snapkv:B=5,pool=median", "pool must be max or avg"},
      {"snapkv:B=5,", "trailing ','"},
      {"snapkv:B=5,,W=3", "two ',' in a row"},
      {"snapkv:", "nothing after ':'"},
      {"snapkv:B", "expected KEY=VALUE"},
      {"snap:B=5", "unknown policy \"snap\""},
      {"snapkv: B=5", "no spaces"},
      {"streaming:W=0", "W must be >= 1"},
      {"h2o:W=4", "missing B"},
      {"pyramidkv:B=8,beta=0.5", "beta must be >= 1"},
      {"pyramidkv:B=8,beta=inf", "beta must be a number"},
      {"fastgen:T=1", "T must be in [0, 1)"},
      {"fastgen:F=1.5", "F must be in [0, 1]"},
      {"fastgen:T=x", "T must be a number"},
      {"quest:R=2", "missing K"},
      {"quest:K=4,R=0", "R must be >= 1"},
      {"lserve:K=4,f=2", "f must be in [0, 1]"},
      {"lserve:K=4,t=-1", "t must be in [0, 1]"},
      {"quest:K=4,B=2", "B must be in [0, 1]"},
      {"lserve:K=4,w=-2", "w must be"},
      {"layerwise:L=2", "missing rest"},
      {"layerwise:rest=full", "missing L"},
      {"layerwise:L=2,rest=snapkv:B=0", "snapkv: B must be >= 1"},
      {"layerwise:L=2,rest=(full", "unbalanced '('"},
      {"layerwise:L=2,rest=(full)x", "unexpected text after ')'"},
      {"heads:rest=full", "needs at least one group"},
      {"heads:full@foo=1", "selector must be profile=FRACTION or kv=LIST"},
      {"heads:full@kv=3-1", "runs backwards"},
      {"heads:full@kv=1+1", "lists an index twice"},
      {"heads:full@profile=1.5", "profile must be in [0, 1]"},
      {"heads:(full)", "needs '@'"},
      {"heads:snapkv:B=5@kv=1", "goes in parentheses: (POLICY:...)@SELECTOR"},
      {"heads:full@kv=1,X=2", "unknown parameter \"X\" (expected groups and rest)"},
      // rest= takes the rest of the string, so this names a policy "full,full@kv=0".
      {"heads:rest=full,full@kv=0", "unknown policy \"full,full@kv=0\""},
      {"full:X=1", "unknown parameter \"X\""},
  };
  for (const auto& [input, expected] : cases) {
    const std::string message = error_of([&input = input] { parse_policy(input); });
    EXPECT_NE(message.find(expected), std::string::npos)
        << "input \"" << input << "\" gave \"" << message << "\", wanted \"" << expected << "\"";
  }
  const std::vector<std::pair<std::string, std::string>> json_cases = {
      {"{", "invalid KV policy JSON"},
      {"{\"B\": 5}", "needs a \"name\" string"},
      {"{\"name\": \"snapkv\", \"B\": true}", "kv_policy (snapkv).B must be a number or a string"},
      {"{\"name\": \"snapkv\", \"B\": 5, \"pool\": \"max,W=1\"}", "must be a plain word"},
      {"{\"name\": \"snapkv\", \"B\": -5}", "B must be a non-negative integer"},
      {"{\"name\": \"heads\", \"groups\": [{\"policy\": \"full\"}]}", "needs \"profile\""},
      {"{\"name\": \"heads\", \"groups\": [{\"policy\": \"full\", \"kv\": [-1]}]}",
       "non-negative integers"},
      {"[1]", "must be a string or an object"},
  };
  for (const auto& [input, expected] : json_cases) {
    const std::string message = error_of([&input = input] { parse_policy_json(input); });
    EXPECT_NE(message.find(expected), std::string::npos)
        << "input " << input << " gave \"" << message << "\", wanted \"" << expected << "\"";
  }
}

// ----------------------------------------------------------------------------- resolution

CalibrationProfile test_profile(int64_t num_layers, int64_t num_kv_heads,
                                std::vector<double> scores) {
  CalibrationProfile profile;
  profile.model_name = "test";
  profile.model_fingerprint = "fp";
  profile.num_layers = num_layers;
  profile.num_kv_heads = num_kv_heads;
  profile.streaming_scores = std::move(scores);
  return profile;
}

// What a resolved plan's policy objects tell admission: each stream's bound on kept keys (for
// a prompt of 1000 tokens and no generated ones) and the observation rows they score.
std::optional<int64_t> bound(const SparsityPlan& plan, size_t stream) {
  return SparsityController(plan).max_kept_tokens(1000, 0)[stream];
}
int32_t observation_rows(const SparsityPlan& plan) {
  return SparsityController(plan).observation_rows();
}

TEST(Resolve, LeafPoliciesApplyToEveryHead) {
  const ModelShape shape{3, 2};
  const SparsityPlan full = resolve(parse_policy("full"), shape);
  EXPECT_TRUE(full.is_dense());
  EXPECT_EQ(full.heads.size(), 6u);
  EXPECT_EQ(observation_rows(full), 0);

  const SparsityPlan snap = resolve(parse_policy("snapkv:B=100,W=16,P=3,pool=avg"), shape);
  for (size_t s = 0; s < snap.heads.size(); ++s) {
    EXPECT_EQ(snap.heads[s], HeadPolicy(ObservationTopHead{100, 16, 3, Pooling::kAvg}));
    EXPECT_EQ(bound(snap, s), 116);
  }
  EXPECT_EQ(observation_rows(snap), 16);
  EXPECT_FALSE(snap.is_dense());

  const SparsityPlan stream = resolve(parse_policy("streaming:S=4,W=60"), shape);
  EXPECT_EQ(stream.at(2, 1), HeadPolicy(SinkWindowHead{4, 60}));
  EXPECT_EQ(bound(stream, 5), 64);
  EXPECT_EQ(observation_rows(stream), 0);

  const SparsityPlan h2o = resolve(parse_policy("h2o:B=30,W=10"), shape);
  EXPECT_EQ(h2o.at(0, 0), HeadPolicy(HeavyHitterHead{30, 10}));
  EXPECT_EQ(bound(h2o, 0), 41);  // + the new token before its step evicts one

  const SparsityPlan fastgen = resolve(parse_policy("fastgen:W=20"), shape);
  EXPECT_EQ(fastgen.at(1, 1), HeadPolicy(FastGenPendingHead{0.05, 20, 0.1}));
  EXPECT_EQ(bound(fastgen, 3), std::nullopt);
  EXPECT_EQ(observation_rows(fastgen), 20);

  const SparsityPlan quest = resolve(parse_policy("quest:K=8,R=2,S=1,W=16"), shape);
  EXPECT_EQ(quest.at(1, 0), HeadPolicy(PageSelectHead{8, 2, 1, 16}));
  EXPECT_EQ(bound(quest, 2), std::nullopt);  // memory is not freed
}

TEST(Resolve, LayerwiseKeepsTheFirstLayersDense) {
  const SparsityPlan plan = resolve(parse_policy("layerwise:L=2,rest=h2o:B=8,W=4"), {5, 2});
  for (int64_t l = 0; l < 5; ++l) {
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(plan.at(l, h), l < 2 ? HeadPolicy(DenseHead{}) : HeadPolicy(HeavyHitterHead{8, 4}))
          << l << " " << h;
    }
  }
  // L beyond the model: everything dense.
  EXPECT_TRUE(resolve(parse_policy("layerwise:L=9,rest=h2o:B=8"), {5, 2}).is_dense());
}

TEST(Resolve, PyramidBudgetsShrinkUpwardsAndSumToTheUniformTotal) {
  for (int64_t num_layers : {1, 2, 3, 5, 8, 32}) {
    for (int64_t budget : {1, 7, 64, 512, 1000}) {
      for (double beta : {1.0, 2.0, 20.0}) {
        const std::vector<int64_t> b = pyramid_budgets(budget, beta, num_layers);
        ASSERT_EQ(std::ssize(b), num_layers);
        EXPECT_EQ(std::accumulate(b.begin(), b.end(), int64_t{0}), budget * num_layers)
            << num_layers << " " << budget << " " << beta;
        for (size_t l = 1; l < b.size(); ++l) EXPECT_LE(b[l], b[l - 1]) << l;
        for (int64_t v : b) EXPECT_GE(v, 0);
      }
    }
  }
  // beta = 1: uniform. Otherwise the top layer gets ~B / beta and the bottom ~2B - B / beta.
  EXPECT_EQ(pyramid_budgets(100, 1.0, 4), (std::vector<int64_t>{100, 100, 100, 100}));
  EXPECT_EQ(pyramid_budgets(100, 20.0, 3), (std::vector<int64_t>{195, 100, 5}));
  EXPECT_EQ(pyramid_budgets(100, 2.0, 2), (std::vector<int64_t>{150, 50}));

  // In a plan: the schedule spans the layers pyramidkv covers (after layerwise's dense ones).
  const SparsityPlan plan =
      resolve(parse_policy("layerwise:L=1,rest=pyramidkv:B=100,W=8,beta=2"), {3, 2});
  EXPECT_EQ(plan.at(0, 0), HeadPolicy(DenseHead{}));
  EXPECT_EQ(std::get<ObservationTopHead>(plan.at(1, 1)).budget, 150);
  EXPECT_EQ(std::get<ObservationTopHead>(plan.at(2, 0)).budget, 50);
  EXPECT_EQ(std::get<ObservationTopHead>(plan.at(2, 0)).window, 8);
}

TEST(Resolve, ProfileSelectsTheMostStreamingLikeHeads) {
  // 2 layers x 4 KV heads; scores with a tie (0.9 at (0,1) and (1,2)).
  const CalibrationProfile profile =
      test_profile(2, 4, {0.1, 0.9, 0.3, 0.8, /**/ 0.2, 0.05, 0.9, 0.7});
  const SparsityPlan plan = resolve(
      parse_policy("heads:(streaming:S=2,W=16)@profile=0.25,rest=snapkv:B=32"), {2, 4}, &profile);
  // round(0.25 * 8) = 2: the two 0.9 heads.
  int64_t num_streaming = 0;
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t h = 0; h < 4; ++h) {
      const bool streaming = std::holds_alternative<SinkWindowHead>(plan.at(l, h));
      num_streaming += streaming;
      EXPECT_EQ(streaming, (l == 0 && h == 1) || (l == 1 && h == 2)) << l << " " << h;
    }
  }
  EXPECT_EQ(num_streaming, 2);
  // A tie at the cut: the lower (layer, head) wins. 3 heads: 0.9, 0.9, then 0.8 at (0,3).
  const SparsityPlan three = resolve(parse_policy("lserve:K=4,S=4,W=64,f=0.375"), {2, 4}, &profile);
  EXPECT_EQ(three.at(0, 3), HeadPolicy(SinkWindowHead{4, 64}));
  EXPECT_EQ(three.at(1, 3), HeadPolicy(PageSelectHead{4, 4, 4, 64}));
  // t: of those 3, only heads scoring at least t stream (0.8 < 0.85 stays a quest head).
  const SparsityPlan scored =
      resolve(parse_policy("lserve:K=4,S=4,W=64,f=0.375,t=0.85"), {2, 4}, &profile);
  EXPECT_EQ(scored.at(0, 1), HeadPolicy(SinkWindowHead{4, 64}));
  EXPECT_EQ(scored.at(1, 2), HeadPolicy(SinkWindowHead{4, 64}));
  EXPECT_EQ(scored.at(0, 3), HeadPolicy(PageSelectHead{4, 4, 4, 64}));
  EXPECT_EQ(to_string(parse_policy("lserve:K=4,f=0.375,t=0.85")),
            "lserve:K=4,R=4,S=4,W=32,f=0.375,t=0.85");
  EXPECT_EQ(parse_policy_json(R"({"name": "lserve", "K": 4, "t": 0.85})"),
            parse_policy("lserve:K=4,t=0.85"));
  const CalibrationProfile tied = test_profile(1, 4, {0.5, 0.5, 0.5, 0.5});
  const SparsityPlan half = resolve(parse_policy("lserve:K=4,f=0.5"), {1, 4}, &tied);
  EXPECT_TRUE(std::holds_alternative<SinkWindowHead>(half.at(0, 0)));
  EXPECT_TRUE(std::holds_alternative<SinkWindowHead>(half.at(0, 1)));
  EXPECT_TRUE(std::holds_alternative<PageSelectHead>(half.at(0, 2)));
  EXPECT_TRUE(std::holds_alternative<PageSelectHead>(half.at(0, 3)));
  // f = 0 needs no profile: all heads dynamic.
  const SparsityPlan no_streaming = resolve(parse_policy("lserve:K=4,f=0"), {2, 2});
  for (const HeadPolicy& head : no_streaming.heads) {
    EXPECT_TRUE(std::holds_alternative<PageSelectHead>(head));
  }
}

TEST(Resolve, ExplicitHeadAndLayerGroups) {
  const SparsityPlan plan =
      resolve(parse_policy("layers:(heads:(streaming:W=8)@kv=1,rest=full)@0,(h2o:B=4,W=2)@2,"
                           "rest=snapkv:B=16"),
              {3, 2});
  EXPECT_EQ(plan.at(0, 0), HeadPolicy(DenseHead{}));
  EXPECT_EQ(plan.at(0, 1), HeadPolicy(SinkWindowHead{4, 8}));
  EXPECT_EQ(plan.at(1, 0), HeadPolicy(ObservationTopHead{16, 32, 7, Pooling::kMax}));
  EXPECT_EQ(plan.at(2, 1), HeadPolicy(HeavyHitterHead{4, 2}));
}

TEST(Resolve, ErrorsNameTheProblem) {
  const CalibrationProfile profile = test_profile(2, 2, {0.1, 0.2, 0.3, 0.4});
  EXPECT_NE(error_of([&] {
              resolve(parse_policy("lserve:K=4"), {2, 2});
            }).find("none was given (write one with `sieve calibrate`)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              resolve(parse_policy("lserve:K=4"), {3, 2}, &profile);
            }).find("profile is for 2 layers x 2 KV heads, the model has 3 x 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              resolve(parse_policy("heads:full@kv=2"), {2, 2});
            }).find("kv head 2 out of range (the model has 2 KV heads)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              resolve(parse_policy("heads:full@kv=0,(h2o:B=4)@kv=0-1"), {2, 2});
            }).find("kv head 0 is in two groups"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              resolve(parse_policy("layers:full@5"), {2, 2});
            }).find("layer 5 out of range"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              resolve(parse_policy("full"), {0, 2});
            }).find("model shape"),
            std::string::npos);
}

}  // namespace
}  // namespace sieve::sparsity
