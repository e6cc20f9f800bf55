#include "util/error.h"
