#pragma once
// Errors as the OpenAI API shows them: {"error": {"message", "type", "param", "code"}}, and the
// few every endpoint shares (a bad parameter, an unknown model, an engine refusal).
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/admission.h"
#include "server/json.h"

namespace sieve::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::optional<std::string> param;
  std::optional<std::string> code;
  json to_json() const;
};

class ApiException : public std::runtime_error {
 public:
  explicit ApiException(ApiError error)
      : std::runtime_error(error.message), error_(std::move(error)) {}
  const ApiError& error() const { return error_; }

 private:
  ApiError error_;
};

// 400 naming the parameter.
[[noreturn]] void throw_invalid(std::string param, std::string message);

// 404 for a "model" (or /v1/models/{id}) this server does not serve.
ApiError model_not_found(const std::string& name);

// The engine's refusal of a request, in OpenAI's terms: status and type by kind, its param.
ApiError admission_api_error(const engine::AdmissionError& refusal);

}  // namespace sieve::server
