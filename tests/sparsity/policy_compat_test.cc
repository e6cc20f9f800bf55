// Every policy string below parsed, printed, wrote JSON and resolved exactly so before the
// policies declared their parameters beside them (policy_type.h): the canonical string, the
// JSON and the resolved heads (run-length, on 3 layers x 2 KV heads with a calibration profile
// and on 5 layers x 1 KV head without) were recorded from that code and must not change.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sparsity/calibration.h"
#include "sparsity/policy_spec.h"
#include "util/error.h"

namespace sieve::sparsity {
namespace {

struct Recorded {
  std::string input, canonical, json, plan_3x2, plan_5x1;
};

// Each head's canonical string, equal neighbours counted ("snapkv:... x3"); or the error.
std::string plan_text(const PolicySpec& spec, ModelShape shape, const CalibrationProfile* profile) {
  try {
    const SparsityPlan plan = resolve(spec, shape, profile);
    std::string out, last;
    int run = 0;
    const auto flush = [&] {
      if (run == 0) return;
      if (!out.empty()) out += ' ';
      out += last + (run > 1 ? " x" + std::to_string(run) : "");
    };
    for (const HeadPolicy& head : plan.heads) {
      const std::string text =
          std::visit([](const auto& h) { return to_string(PolicySpec{h}); }, head);
      if (text == last) {
        ++run;
        continue;
      }
      flush();
      last = text;
      run = 1;
    }
    flush();
    return out;
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
}

const std::vector<Recorded> kRecorded = {
    {"full", "full", R"({"name":"full"})", "full x6", "full x5"},
    {"streaming", "streaming:S=4,W=256", R"({"S":4,"W":256,"name":"streaming"})",
     "streaming:S=4,W=256 x6", "streaming:S=4,W=256 x5"},
    {"streaming:S=4,W=256", "streaming:S=4,W=256", R"({"S":4,"W":256,"name":"streaming"})",
     "streaming:S=4,W=256 x6", "streaming:S=4,W=256 x5"},
    {"streaming:W=64", "streaming:S=4,W=64", R"({"S":4,"W":64,"name":"streaming"})",
     "streaming:S=4,W=64 x6", "streaming:S=4,W=64 x5"},
    {"streaming:S=0,W=1", "streaming:S=0,W=1", R"({"S":0,"W":1,"name":"streaming"})",
     "streaming:S=0,W=1 x6", "streaming:S=0,W=1 x5"},
    {"streaming:W=256,S=4", "streaming:S=4,W=256", R"({"S":4,"W":256,"name":"streaming"})",
     "streaming:S=4,W=256 x6", "streaming:S=4,W=256 x5"},
    {"h2o:B=256,W=32", "h2o:B=256,W=32", R"({"B":256,"W":32,"name":"h2o"})", "h2o:B=256,W=32 x6",
     "h2o:B=256,W=32 x5"},
    {"h2o:B=100", "h2o:B=100,W=32", R"({"B":100,"W":32,"name":"h2o"})", "h2o:B=100,W=32 x6",
     "h2o:B=100,W=32 x5"},
    {"h2o:B=1,W=0", "h2o:B=1,W=0", R"({"B":1,"W":0,"name":"h2o"})", "h2o:B=1,W=0 x6",
     "h2o:B=1,W=0 x5"},
    {"snapkv:B=512", "snapkv:B=512,W=32,P=7,pool=max",
     R"({"B":512,"P":7,"W":32,"name":"snapkv","pool":"max"})", "snapkv:B=512,W=32,P=7,pool=max x6",
     "snapkv:B=512,W=32,P=7,pool=max x5"},
    {"snapkv:B=512,W=16,P=5,pool=avg", "snapkv:B=512,W=16,P=5,pool=avg",
     R"({"B":512,"P":5,"W":16,"name":"snapkv","pool":"avg"})", "snapkv:B=512,W=16,P=5,pool=avg x6",
     "snapkv:B=512,W=16,P=5,pool=avg x5"},
    {"snapkv:B=8,W=4,P=1,pool=max,G=3", "snapkv:B=8,W=4,P=1,pool=max,G=3",
     R"({"B":8,"G":3,"P":1,"W":4,"name":"snapkv","pool":"max"})",
     "snapkv:B=8,W=4,P=1,pool=max,G=3 x6", "snapkv:B=8,W=4,P=1,pool=max,G=3 x5"},
    {"snapkv:B=64,G=0", "snapkv:B=64,W=32,P=7,pool=max",
     R"({"B":64,"P":7,"W":32,"name":"snapkv","pool":"max"})", "snapkv:B=64,W=32,P=7,pool=max x6",
     "snapkv:B=64,W=32,P=7,pool=max x5"},
    {"snapkv:pool=avg,B=3,W=1,P=9", "snapkv:B=3,W=1,P=9,pool=avg",
     R"({"B":3,"P":9,"W":1,"name":"snapkv","pool":"avg"})", "snapkv:B=3,W=1,P=9,pool=avg x6",
     "snapkv:B=3,W=1,P=9,pool=avg x5"},
    {"pyramidkv:B=256", "pyramidkv:B=256,W=32,P=7,pool=max,beta=20",
     R"({"B":256,"P":7,"W":32,"beta":20.0,"name":"pyramidkv","pool":"max"})",
     "snapkv:B=499,W=32,P=7,pool=max x2 snapkv:B=256,W=32,P=7,pool=max x2 "
     "snapkv:B=13,W=32,P=7,pool=max x2",
     "snapkv:B=499,W=32,P=7,pool=max snapkv:B=378,W=32,P=7,pool=max snapkv:B=256,W=32,P=7,pool=max "
     "snapkv:B=134,W=32,P=7,pool=max snapkv:B=13,W=32,P=7,pool=max"},
    {"pyramidkv:B=512,W=32,P=7,pool=max,beta=10", "pyramidkv:B=512,W=32,P=7,pool=max,beta=10",
     R"({"B":512,"P":7,"W":32,"beta":10.0,"name":"pyramidkv","pool":"max"})",
     "snapkv:B=973,W=32,P=7,pool=max x2 snapkv:B=512,W=32,P=7,pool=max x2 "
     "snapkv:B=51,W=32,P=7,pool=max x2",
     "snapkv:B=973,W=32,P=7,pool=max snapkv:B=742,W=32,P=7,pool=max snapkv:B=512,W=32,P=7,pool=max "
     "snapkv:B=282,W=32,P=7,pool=max snapkv:B=51,W=32,P=7,pool=max"},
    {"pyramidkv:B=100,W=8,beta=1,G=2", "pyramidkv:B=100,W=8,P=7,pool=max,G=2,beta=1",
     R"({"B":100,"G":2,"P":7,"W":8,"beta":1.0,"name":"pyramidkv","pool":"max"})",
     "snapkv:B=100,W=8,P=7,pool=max,G=2 x6", "snapkv:B=100,W=8,P=7,pool=max,G=2 x5"},
    {"pyramidkv:B=100,beta=2.5,pool=avg", "pyramidkv:B=100,W=32,P=7,pool=avg,beta=2.5",
     R"({"B":100,"P":7,"W":32,"beta":2.5,"name":"pyramidkv","pool":"avg"})",
     "snapkv:B=160,W=32,P=7,pool=avg x2 snapkv:B=100,W=32,P=7,pool=avg x2 "
     "snapkv:B=40,W=32,P=7,pool=avg x2",
     "snapkv:B=160,W=32,P=7,pool=avg snapkv:B=130,W=32,P=7,pool=avg snapkv:B=100,W=32,P=7,pool=avg "
     "snapkv:B=70,W=32,P=7,pool=avg snapkv:B=40,W=32,P=7,pool=avg"},
    {"adakv:B=64", "adakv:B=64,W=32,P=7,pool=max,alpha=0.2",
     R"({"B":64,"P":7,"W":32,"alpha":0.2,"name":"adakv","pool":"max"})",
     "adakv:B=64,W=32,P=7,pool=max,alpha=0.2 x6", "adakv:B=64,W=32,P=7,pool=max,alpha=0.2 x5"},
    {"adakv:B=64,W=8,P=3,pool=avg,alpha=0.5", "adakv:B=64,W=8,P=3,pool=avg,alpha=0.5",
     R"({"B":64,"P":3,"W":8,"alpha":0.5,"name":"adakv","pool":"avg"})",
     "adakv:B=64,W=8,P=3,pool=avg,alpha=0.5 x6", "adakv:B=64,W=8,P=3,pool=avg,alpha=0.5 x5"},
    {"adakv:B=16,W=4,alpha=0", "adakv:B=16,W=4,P=7,pool=max,alpha=0",
     R"({"B":16,"P":7,"W":4,"alpha":0.0,"name":"adakv","pool":"max"})",
     "adakv:B=16,W=4,P=7,pool=max,alpha=0 x6", "adakv:B=16,W=4,P=7,pool=max,alpha=0 x5"},
    {"adakv:B=16,W=4,alpha=1", "adakv:B=16,W=4,P=7,pool=max,alpha=1",
     R"({"B":16,"P":7,"W":4,"alpha":1.0,"name":"adakv","pool":"max"})",
     "adakv:B=16,W=4,P=7,pool=max,alpha=1 x6", "adakv:B=16,W=4,P=7,pool=max,alpha=1 x5"},
    {"fastgen", "fastgen:T=0.05,W=64,F=0.1", R"({"F":0.1,"T":0.05,"W":64,"name":"fastgen"})",
     "fastgen:T=0.05,W=64,F=0.1 x6", "fastgen:T=0.05,W=64,F=0.1 x5"},
    {"fastgen:T=0.02,W=100,F=0.25", "fastgen:T=0.02,W=100,F=0.25",
     R"({"F":0.25,"T":0.02,"W":100,"name":"fastgen"})", "fastgen:T=0.02,W=100,F=0.25 x6",
     "fastgen:T=0.02,W=100,F=0.25 x5"},
    {"fastgen:T=0,W=1,F=1", "fastgen:T=0,W=1,F=1", R"({"F":1.0,"T":0.0,"W":1,"name":"fastgen"})",
     "fastgen:T=0,W=1,F=1 x6", "fastgen:T=0,W=1,F=1 x5"},
    {"fastgen:F=0.1", "fastgen:T=0.05,W=64,F=0.1", R"({"F":0.1,"T":0.05,"W":64,"name":"fastgen"})",
     "fastgen:T=0.05,W=64,F=0.1 x6", "fastgen:T=0.05,W=64,F=0.1 x5"},
    {"quest:K=16", "quest:K=16,R=1,S=4,W=32", R"({"K":16,"R":1,"S":4,"W":32,"name":"quest"})",
     "quest:K=16,R=1,S=4,W=32 x6", "quest:K=16,R=1,S=4,W=32 x5"},
    {"quest:K=64,R=2,S=8,W=48", "quest:K=64,R=2,S=8,W=48",
     R"({"K":64,"R":2,"S":8,"W":48,"name":"quest"})", "quest:K=64,R=2,S=8,W=48 x6",
     "quest:K=64,R=2,S=8,W=48 x5"},
    {"quest:K=1,R=1,S=0,W=0", "quest:K=1,R=1,S=0,W=0",
     R"({"K":1,"R":1,"S":0,"W":0,"name":"quest"})", "quest:K=1,R=1,S=0,W=0 x6",
     "quest:K=1,R=1,S=0,W=0 x5"},
    {"quest:K=16,B=1", "quest:K=16,R=1,S=4,W=32,B=1",
     R"({"B":1,"K":16,"R":1,"S":4,"W":32,"name":"quest"})", "quest:K=16,R=1,S=4,W=32,B=1 x6",
     "quest:K=16,R=1,S=4,W=32,B=1 x5"},
    {"lserve:K=8,f=0,W=2044,w=8,B=1", "lserve:K=8,R=4,S=4,W=2044,B=1,f=0,w=8",
     R"({"B":1,"K":8,"R":4,"S":4,"W":2044,"f":0.0,"name":"lserve","w":8})",
     "quest:K=8,R=4,S=4,W=8,B=1 x6", "quest:K=8,R=4,S=4,W=8,B=1 x5"},
    {"lserve:K=16", "lserve:K=16,R=4,S=4,W=32,f=0.5",
     R"({"K":16,"R":4,"S":4,"W":32,"f":0.5,"name":"lserve"})",
     "streaming:S=4,W=32 quest:K=16,R=4,S=4,W=32 x2 streaming:S=4,W=32 quest:K=16,R=4,S=4,W=32 "
     "streaming:S=4,W=32",
     "error: lserve selects streaming heads from a calibration profile, but none was given (write "
     "one with `sieve calibrate`)"},
    {"lserve:K=32,R=4,S=4,W=256,f=0.5", "lserve:K=32,R=4,S=4,W=256,f=0.5",
     R"({"K":32,"R":4,"S":4,"W":256,"f":0.5,"name":"lserve"})",
     "streaming:S=4,W=256 quest:K=32,R=4,S=4,W=256 x2 streaming:S=4,W=256 quest:K=32,R=4,S=4,W=256 "
     "streaming:S=4,W=256",
     "error: lserve selects streaming heads from a calibration profile, but none was given (write "
     "one with `sieve calibrate`)"},
    {"lserve:K=8,R=1,S=2,W=16,f=0,t=0.3", "lserve:K=8,R=1,S=2,W=16,f=0,t=0.3",
     R"({"K":8,"R":1,"S":2,"W":16,"f":0.0,"name":"lserve","t":0.3})", "quest:K=8,R=1,S=2,W=16 x6",
     "quest:K=8,R=1,S=2,W=16 x5"},
    {"lserve:K=8,f=0.25,t=0", "lserve:K=8,R=4,S=4,W=32,f=0.25",
     R"({"K":8,"R":4,"S":4,"W":32,"f":0.25,"name":"lserve"})",
     "streaming:S=4,W=32 quest:K=8,R=4,S=4,W=32 x2 streaming:S=4,W=32 quest:K=8,R=4,S=4,W=32 x2",
     "error: lserve selects streaming heads from a calibration profile, but none was given (write "
     "one with `sieve calibrate`)"},
    {"lserve:K=8,f=1,t=1", "lserve:K=8,R=4,S=4,W=32,f=1,t=1",
     R"({"K":8,"R":4,"S":4,"W":32,"f":1.0,"name":"lserve","t":1.0})", "quest:K=8,R=4,S=4,W=32 x6",
     "error: lserve selects streaming heads from a calibration profile, but none was given (write "
     "one with `sieve calibrate`)"},
    {"lserve:K=8,f=0,W=0", "lserve:K=8,R=4,S=4,W=0,f=0",
     R"({"K":8,"R":4,"S":4,"W":0,"f":0.0,"name":"lserve"})", "quest:K=8,R=4,S=4,W=0 x6",
     "quest:K=8,R=4,S=4,W=0 x5"},
    {"layerwise:L=3,rest=snapkv:B=512,W=16", "layerwise:L=3,rest=snapkv:B=512,W=16,P=7,pool=max",
     R"({"L":3,"name":"layerwise","rest":{"B":512,"P":7,"W":16,"name":"snapkv","pool":"max"}})",
     "full x6", "full x3 snapkv:B=512,W=16,P=7,pool=max x2"},
    {"layerwise:rest=(snapkv:B=512,W=16),L=3", "layerwise:L=3,rest=snapkv:B=512,W=16,P=7,pool=max",
     R"({"L":3,"name":"layerwise","rest":{"B":512,"P":7,"W":16,"name":"snapkv","pool":"max"}})",
     "full x6", "full x3 snapkv:B=512,W=16,P=7,pool=max x2"},
    {"layerwise:L=0,rest=full", "layerwise:L=0,rest=full",
     R"({"L":0,"name":"layerwise","rest":{"name":"full"}})", "full x6", "full x5"},
    {"layerwise:L=1,rest=adakv:B=16,W=4",
     "layerwise:L=1,rest=adakv:B=16,W=4,P=7,pool=max,alpha=0.2",
     R"({"L":1,"name":"layerwise","rest":{"B":16,"P":7,"W":4,"alpha":0.2,"name":"adakv","pool":"max"}})",
     "full x2 adakv:B=16,W=4,P=7,pool=max,alpha=0.2 x4",
     "full adakv:B=16,W=4,P=7,pool=max,alpha=0.2 x4"},
    {"layerwise:L=1,rest=layerwise:L=1,rest=h2o:B=4,W=2",
     "layerwise:L=1,rest=layerwise:L=1,rest=h2o:B=4,W=2",
     R"({"L":1,"name":"layerwise","rest":{"L":1,"name":"layerwise","rest":{"B":4,"W":2,"name":"h2o"}}})",
     "full x2 h2o:B=4,W=2 x4", "full h2o:B=4,W=2 x4"},
    {"heads:streaming@profile=0.5,rest=snapkv:B=256",
     "heads:(streaming:S=4,W=256)@profile=0.5,rest=snapkv:B=256,W=32,P=7,pool=max",
     R"({"groups":[{"policy":{"S":4,"W":256,"name":"streaming"},"profile":0.5}],"name":"heads","rest":{"B":256,"P":7,"W":32,"name":"snapkv","pool":"max"}})",
     "streaming:S=4,W=256 snapkv:B=256,W=32,P=7,pool=max x2 streaming:S=4,W=256 "
     "snapkv:B=256,W=32,P=7,pool=max streaming:S=4,W=256",
     "error: heads:profile selects streaming heads from a calibration profile, but none was given "
     "(write one with `sieve calibrate`)"},
    {"heads:(streaming:S=2,W=64)@kv=0+2-3,(h2o:B=8,W=8)@kv=1",
     "heads:(streaming:S=2,W=64)@kv=0+2-3,(h2o:B=8,W=8)@kv=1,rest=full",
     R"({"groups":[{"kv":[0,2,3],"policy":{"S":2,"W":64,"name":"streaming"}},{"kv":[1],"policy":{"B":8,"W":8,"name":"h2o"}}],"name":"heads","rest":{"name":"full"}})",
     "error: heads: kv head 2 out of range (the model has 2 KV heads)",
     "error: heads: kv head 2 out of range (the model has 1 KV heads)"},
    {"heads:full@kv=0,rest=(pyramidkv:B=30,beta=3)",
     "heads:(full)@kv=0,rest=pyramidkv:B=30,W=32,P=7,pool=max,beta=3",
     R"({"groups":[{"kv":[0],"policy":{"name":"full"}}],"name":"heads","rest":{"B":30,"P":7,"W":32,"beta":3.0,"name":"pyramidkv","pool":"max"}})",
     "full snapkv:B=50,W=32,P=7,pool=max full snapkv:B=30,W=32,P=7,pool=max full "
     "snapkv:B=10,W=32,P=7,pool=max",
     "full x5"},
    {"heads:(quest:K=4)@kv=1,rest=adakv:B=8,W=2",
     "heads:(quest:K=4,R=1,S=4,W=32)@kv=1,rest=adakv:B=8,W=2,P=7,pool=max,alpha=0.2",
     R"({"groups":[{"kv":[1],"policy":{"K":4,"R":1,"S":4,"W":32,"name":"quest"}}],"name":"heads","rest":{"B":8,"P":7,"W":2,"alpha":0.2,"name":"adakv","pool":"max"}})",
     "adakv:B=8,W=2,P=7,pool=max,alpha=0.2 quest:K=4,R=1,S=4,W=32 "
     "adakv:B=8,W=2,P=7,pool=max,alpha=0.2 quest:K=4,R=1,S=4,W=32 "
     "adakv:B=8,W=2,P=7,pool=max,alpha=0.2 quest:K=4,R=1,S=4,W=32",
     "error: heads: kv head 1 out of range (the model has 1 KV heads)"},
    {"layers:full@0-1,(h2o:B=64)@5+7,rest=snapkv:B=256",
     "layers:(full)@0-1,(h2o:B=64,W=32)@5+7,rest=snapkv:B=256,W=32,P=7,pool=max",
     R"({"groups":[{"layers":[0,1],"policy":{"name":"full"}},{"layers":[5,7],"policy":{"B":64,"W":32,"name":"h2o"}}],"name":"layers","rest":{"B":256,"P":7,"W":32,"name":"snapkv","pool":"max"}})",
     "error: layers: layer 5 out of range (the model has 3 layers)",
     "error: layers: layer 5 out of range (the model has 5 layers)"},
    {"layers:(snapkv:B=16,W=4)@2,rest=(lserve:K=4,f=0)",
     "layers:(snapkv:B=16,W=4,P=7,pool=max)@2,rest=lserve:K=4,R=4,S=4,W=32,f=0",
     R"({"groups":[{"layers":[2],"policy":{"B":16,"P":7,"W":4,"name":"snapkv","pool":"max"}}],"name":"layers","rest":{"K":4,"R":4,"S":4,"W":32,"f":0.0,"name":"lserve"}})",
     "quest:K=4,R=4,S=4,W=32 x4 snapkv:B=16,W=4,P=7,pool=max x2",
     "quest:K=4,R=4,S=4,W=32 x2 snapkv:B=16,W=4,P=7,pool=max quest:K=4,R=4,S=4,W=32 x2"},
    {"layers:(heads:(streaming:S=1,W=8)@kv=0,rest=h2o:B=4,W=2)@1,rest=full",
     "layers:(heads:(streaming:S=1,W=8)@kv=0,rest=h2o:B=4,W=2)@1,rest=full",
     R"({"groups":[{"layers":[1],"policy":{"groups":[{"kv":[0],"policy":{"S":1,"W":8,"name":"streaming"}}],"name":"heads","rest":{"B":4,"W":2,"name":"h2o"}}}],"name":"layers","rest":{"name":"full"}})",
     "full x2 streaming:S=1,W=8 h2o:B=4,W=2 full x2", "full streaming:S=1,W=8 full x3"},
    {"heads:(layers:full@0,rest=snapkv:B=9,W=3)@kv=0+1,rest=full",
     "heads:(layers:(full)@0,rest=snapkv:B=9,W=3,P=7,pool=max)@kv=0-1,rest=full",
     R"({"groups":[{"kv":[0,1],"policy":{"groups":[{"layers":[0],"policy":{"name":"full"}}],"name":"layers","rest":{"B":9,"P":7,"W":3,"name":"snapkv","pool":"max"}}}],"name":"heads","rest":{"name":"full"}})",
     "full x2 snapkv:B=9,W=3,P=7,pool=max x4",
     "error: heads: kv head 1 out of range (the model has 1 KV heads)"},
    {"lserve:K=4,R=2,S=1,W=4,f=0.5,t=0.4", "lserve:K=4,R=2,S=1,W=4,f=0.5,t=0.4",
     R"({"K":4,"R":2,"S":1,"W":4,"f":0.5,"name":"lserve","t":0.4})",
     "streaming:S=1,W=4 quest:K=4,R=2,S=1,W=4 x2 streaming:S=1,W=4 quest:K=4,R=2,S=1,W=4 "
     "streaming:S=1,W=4",
     "error: lserve selects streaming heads from a calibration profile, but none was given (write "
     "one with `sieve calibrate`)"},
    {"heads:(streaming:S=1,W=4)@profile=0.34,rest=snapkv:B=10,W=2",
     "heads:(streaming:S=1,W=4)@profile=0.34,rest=snapkv:B=10,W=2,P=7,pool=max",
     R"({"groups":[{"policy":{"S":1,"W":4,"name":"streaming"},"profile":0.34}],"name":"heads","rest":{"B":10,"P":7,"W":2,"name":"snapkv","pool":"max"}})",
     "streaming:S=1,W=4 snapkv:B=10,W=2,P=7,pool=max x2 streaming:S=1,W=4 "
     "snapkv:B=10,W=2,P=7,pool=max x2",
     "error: heads:profile selects streaming heads from a calibration profile, but none was given "
     "(write one with `sieve calibrate`)"},
    {"heads:(streaming:S=1,W=4)@profile=0.5,(h2o:B=3,W=1)@kv=1,rest=full",
     "heads:(streaming:S=1,W=4)@profile=0.5,(h2o:B=3,W=1)@kv=1,rest=full",
     R"({"groups":[{"policy":{"S":1,"W":4,"name":"streaming"},"profile":0.5},{"kv":[1],"policy":{"B":3,"W":1,"name":"h2o"}}],"name":"heads","rest":{"name":"full"}})",
     "streaming:S=1,W=4 h2o:B=3,W=1 full streaming:S=1,W=4 full streaming:S=1,W=4",
     "error: heads:profile selects streaming heads from a calibration profile, but none was given "
     "(write one with `sieve calibrate`)"},
};

TEST(PolicyCompat, EveryRecordedPolicyParsesPrintsAndResolvesAsBefore) {
  const CalibrationProfile profile{.model_name = "m",
                                   .model_fingerprint = "f",
                                   .num_layers = 3,
                                   .num_kv_heads = 2,
                                   .streaming_scores = {0.9, 0.1, 0.5, 0.7, 0.2, 0.6}};
  for (const Recorded& r : kRecorded) {
    const PolicySpec spec = parse_policy(r.input);
    EXPECT_EQ(to_string(spec), r.canonical) << r.input;
    EXPECT_EQ(to_json(spec), r.json) << r.input;
    EXPECT_EQ(parse_policy_json(r.json), spec) << r.input;
    EXPECT_EQ(parse_policy(r.canonical), spec) << r.input;
    EXPECT_EQ(plan_text(spec, {3, 2}, &profile), r.plan_3x2) << r.input;
    EXPECT_EQ(plan_text(spec, {5, 1}, nullptr), r.plan_5x1) << r.input;
  }
}

}  // namespace
}  // namespace sieve::sparsity
