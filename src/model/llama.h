// Older include path of the forward pass; the model is now architecture-generic (model/model.h).
#pragma once

#include "model/model.h"
