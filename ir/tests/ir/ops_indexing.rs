//! GatherElements, GatherND, ScatterElements, ScatterND, Tile, Pad, OneHot, Trilu, DepthToSpace, SpaceToDepth, NonZero, Compress, ReverseSequence.
