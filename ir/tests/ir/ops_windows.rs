//! ConvTranspose, LpPool, MaxPool indices, the normalisations, Resize.
