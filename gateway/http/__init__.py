"""HTTP plumbing under every face: slow-client deadlines, body limits, headers, bearer auth."""
