// Placeholder translation unit for a layer with no sources yet.
