#pragma once
// Reading one field of a request body: its presence, then its JSON type. A wrong type throws
// ApiException (400) naming the parameter. Value ranges are not checked here: sampling
// parameters' ranges are engine::check_sampling_params', the rest belong to the endpoint.
#include <cstdint>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace sieve::server {

// The field `name` of an object, or null when it is absent or JSON null (OpenAI's clients send
// null for "not given").
const json* field(const json& object, const char* name);

double number_of(const json& value, const std::string& param);    // finite
int64_t integer_of(const json& value, const std::string& param);  // 16.0 counts as 16
int32_t int32_of(const json& value, const std::string& param);    // an integer that fits int32
bool bool_of(const json& value, const std::string& param);
std::string string_of(const json& value, const std::string& param);

// An integer in [lo, hi] (limits of the request's own size, not sampling ranges).
int64_t integer_in(const json& value, int64_t lo, int64_t hi, const std::string& param);

// Token ids of a vocabulary of `vocab_size` tokens.
tok::TokenId token_id_of(const json& value, const std::string& param, size_t vocab_size);
std::vector<tok::TokenId> token_array(const json& array, const std::string& param,
                                      size_t vocab_size);

}  // namespace sieve::server
