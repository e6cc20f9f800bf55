#include "server/chat_template.h"
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
TEST(ChatTemplate, Smoke) { EXPECT_EQ(sieve::server::ChatTemplate::parse("a{{ 1 + 2 }}").render(nlohmann::json::object()), "a3"); }
