//! RNN, GRU, LSTM, Attention, RotaryEmbedding, the losses.
