#pragma once
static constexpr int x = 1;
