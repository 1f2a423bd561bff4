"""Methods that choose without the attention the model paid: by position (StreamingLLM), by the keys and values
themselves (Knorm, KeyDiff, LagKV), by the attention future queries are expected to pay (ExpectedAttention), or at
random (the control). Each fits the question-agnostic protocol: nothing it reads depends on a question."""
